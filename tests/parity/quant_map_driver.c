/* quant_map_driver.c: writes the two dynamic quantization maps snug builds (src/core/quant_map.c) for
 * test_quant_maps.py.
 *
 *   quant_map_driver OUT
 *
 * OUT gets 512 little-endian float32: the signed map (first moment), then the unsigned map (second moment). */
#include <stdio.h>

#include "core/quant_map.h"
#include "optim/optim.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: quant_map_driver OUT\n");
        return 2;
    }
    float maps[2][256];
    snug_dynamic_map(maps[0], 1);
    snug_dynamic_map(maps[1], 0);
    FILE *f = fopen(argv[1], "wb");
    if (!f || fwrite(maps, sizeof maps, 1, f) != 1 || fclose(f) != 0) {
        fprintf(stderr, "quant_map_driver: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
