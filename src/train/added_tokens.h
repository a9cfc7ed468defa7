/* added_tokens.h: the tokens a run adds to its tokenizer, as Axolotl adds them (special_tokens' bos_token, eos_token,
 * pad_token and unk_token with add_special_tokens, in that order, then `tokens` with add_tokens, then special_tokens'
 * additional_special_tokens with add_special_tokens), and the tokenizer files a run saves with them (tokenizer.json's
 * added_tokens, tokenizer_config.json's added_tokens_decoder and extra_special_tokens). */
#ifndef SNUG_TRAIN_ADDED_TOKENS_H
#define SNUG_TRAIN_ADDED_TOKENS_H

#include "core/error.h"
#include "data/tokenizer.h"
#include "train/config.h"
#include "train/setup.h"

typedef struct snug_added_tokens {
    int n;
    const char *text[SNUG_TOK_MAX_ADD]; /* point into c, or into buf */
    int special[SNUG_TOK_MAX_ADD];      /* 1: added as a special token */
    char buf[8192 + 4096 + 8];          /* c->tokens and c->extra_special, split at their newlines */
} snug_added_tokens;

/* The tokens c adds, in Axolotl's order (a token the tokenizer has keeps its id). */
void snug_added_tokens_of(const snug_run_config *c, snug_added_tokens *a);

/* Adds c's tokens to the tokenizer files copied into dir: tokenizer.json's added_tokens (the ids of the run's
 * tokenizer) and tokenizer_config.json's added_tokens_decoder. Nothing when none is new or dir has no
 * tokenizer.json. */
int snug_added_tokens_save(const char *dir, const snug_run_config *c, snug_error *e);

/* Axolotl's check before special_tokens' name (eos_token, ...) adds text as a new token: with an adapter, a token
 * its tokenizer writes in more than 2 pieces needs lora_modules_to_save to hold the embedding and the head. */
int snug_setup_check_new_token(const snug_setup *r, const char *name, const char *text, snug_error *e);
/* The tokens of r->c the tokenizer lacks, added: r->tok becomes the grown tokenizer (r->enc its ids and hash; its
 * BOS and EOS as before), r->nadded counts them. A plan whose tokenizer did not load (tok_error) counts them from the
 * file into r->enc.vocab_size. */
int snug_setup_add_tokens(snug_setup *r, snug_error *e);
/* The model config grown to the tokenizer (resize_token_embeddings(len(tokenizer)), Axolotl's call; a multiple of
 * 32 with resize_token_embeddings_to_32x) when tokens were added past config.json's vocab_size: cfg.vocab_base holds
 * the base's rows. Refused where the grown tables could not be kept (adapters without them, tensor parallelism). */
int snug_setup_grow_vocab(snug_setup *r, snug_error *e);

#endif
