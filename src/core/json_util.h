/* json_util.h: small helpers over jansson shared by every reader of JSON files (config.json, safetensors headers,
 * tokenizer.json, datasets). */
#ifndef SNUG_JSON_UTIL_H
#define SNUG_JSON_UTIL_H

#include <stddef.h>

#include <jansson.h>

/* "an object", "an integer", ... for error messages ("hidden_size must be an integer, got a string"). */
const char *snug_json_type_name(const json_t *j);

/* json_loadb that accepts every number JSON allows; every reader of JSON in snug decodes through it.
 *
 * jansson alone refuses an integer beyond the range of json_int_t ("too big integer"), which transformers writes by
 * default (tokenizer_config.json: "model_max_length": 1000000000000000019884624838656), and a number beyond the
 * range of a double ("real number overflow"). Here the text is first decoded as it is; only if that fails on such a
 * number, each of them is rewritten and the text decoded again: an integer beyond json_int_t becomes a real of the
 * nearest double, a number beyond a double becomes a real of +-DBL_MAX (as one below the smallest double becomes 0).
 * Every other number keeps its type and exact value, so a reader that needs an integer finds a real only where the
 * file holds one that no integer type could take, and reports it (see snug_json_is_huge). On failure *err describes
 * the error at its line, column and position in the original text. */
json_t *snug_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err);

/* Whether j is a real outside the range of json_int_t: what an integer too large for any integer type (or 1e30)
 * decodes to. A reader that needs an integer names the key and the value; one that reads a limit may take it as none. */
int snug_json_is_huge(const json_t *j);

/* The text Python's json.dumps writes for a float (float.__repr__: the shortest decimal that reads back as v, the
 * closest to v when several are as short; fixed notation for exponents -4 .. 15, else "1.5e-07" / "1e+16"; NaN,
 * Infinity, -Infinity for the rest). For JSON that must match a Python writer byte for byte. Writes at most 32 bytes
 * with the NUL into buf; returns the length. */
int snug_json_py_float(double v, char buf[32]);

#endif
