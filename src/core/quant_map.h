/* quant_map.h: bitsandbytes' dynamic (tree) quantization map, the 256 codes of its 8-bit blockwise quantization.
 *
 * Low in the house because two floors use it: the 8-bit optimizer state (optim/adamw.c) and the nested (double)
 * quantization of a 4-bit weight's absmax (model/quant4.c). */
#ifndef SNUG_CORE_QUANT_MAP_H
#define SNUG_CORE_QUANT_MAP_H

/* The dynamic (tree) quantization map of bitsandbytes' create_dynamic_map(signed): 256 sorted codes (quant_map.c). */
void snug_dynamic_map(float code[256], int is_signed);

#endif
