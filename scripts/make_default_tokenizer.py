"""Builds assets/tokenizer/: the byte-level BPE tokenizer of the built-in default job, trained with Hugging Face
`tokenizers` on Debian's fortunes (data/fortunes.jsonl). The committed files are this script's output; rerun it
only to change the tokenizer."""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def main(corpus: str, out_dir: str, vocab_size: int = 2048) -> None:
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
              "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 1024,
              "clean_up_tokenization_spaces": False}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {out_dir}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/fortunes.jsonl",
         sys.argv[2] if len(sys.argv) > 2 else "assets/tokenizer")
