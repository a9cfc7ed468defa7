# untied_base.sh: shared by the multi-rank CLI tests (sourced, not a test itself). Needs lib.sh, tok and $W/ids.yaml
# (ids_data.sh). Writes $W/tied (tiny-llama after one step) and $W/base: the same weights with the
# embedding copied into an untied lm_head (untie.sh).
. "$SRC/tests/cli/untie.sh"
"$SNUG" train "$W/ids.yaml" $tok --max_steps 1 --output_dir "$W/tied" \
  > "$W/tied.log" 2>&1 || fatal "the base did not train" "$W/tied.log"
untie "$W/tied" "$W/base" || fatal "the untied base"
