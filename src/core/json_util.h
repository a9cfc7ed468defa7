/* json_util.h: small helpers over jansson shared by every reader of JSON files (config.json, safetensors headers,
 * tokenizer.json, datasets). */
#ifndef SNUG_JSON_UTIL_H
#define SNUG_JSON_UTIL_H

#include <jansson.h>

/* "an object", "an integer", ... for error messages ("hidden_size must be an integer, got a string"). */
const char *snug_json_type_name(const json_t *j);

#endif
