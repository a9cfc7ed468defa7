/* svg.h: the memory plan as a picture: one stacked horizontal bar per setting (the plan as configured, then each
 * lever toggled), one colour per memory category plus the runtime overhead, and a dashed line at each GPU's memory.
 * Written as hand-made SVG text; converted to PNG when rsvg-convert or ImageMagick is installed. */
#ifndef SNUG_SVG_H
#define SNUG_SVG_H

#include "core/arena.h"
#include "core/error.h"

typedef struct snug_svg_bar {
    char label[200];
    double bytes[SNUG_MEM_NCAT];
    double overhead;
} snug_svg_bar;

typedef struct snug_svg_line {
    char label[48];
    double bytes;
} snug_svg_line;

/* Writes the chart to path (atomically). */
int snug_svg_write(const char *path, const char *title, const snug_svg_bar *bars, int nbars,
                   const snug_svg_line *lines, int nlines, snug_error *e);

/* Converts svg_path to png_path with rsvg-convert, else ImageMagick's convert. Returns 0 when a PNG was written,
 * 1 when no converter is installed or it failed (not an error: the SVG is the picture). */
int snug_svg_to_png(const char *svg_path, const char *png_path);

#endif
