/* tboard.h: TensorBoard's event files (report_to: tensorboard), as PyTorch's SummaryWriter writes them.
 *
 * A file events.out.tfevents.<seconds>.<host>.<pid>.0 in the logging folder is a sequence of TFRecords: a
 * little-endian uint64 length, its masked CRC-32C, the bytes of one serialized Event protobuf, their masked CRC-32C.
 * The first Event says file_version "brain.Event:2"; each logged step is one Event (wall_time, step) whose Summary
 * holds one simple_value per tag ("train/loss", "eval/loss", ...), the tags Hugging Face's TensorBoardCallback uses.
 * The few protobuf fields are encoded here by hand (varints, doubles, floats, length-delimited strings); each record
 * is flushed when written, so a run that stops keeps every step it logged. */
#ifndef SNUG_TRAIN_TBOARD_H
#define SNUG_TRAIN_TBOARD_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef struct snug_tboard {
    FILE *f;
    char path[4200];
} snug_tboard;

/* Creates dir (and its parents) and a new event file in it, starting with the file_version event. */
int snug_tboard_open(snug_tboard *tb, const char *dir, snug_error *e);

/* One event at step, stamped with the time now: n scalars, tags[i] = values[i]. Nothing when tb is not open. */
int snug_tboard_scalars(snug_tboard *tb, int64_t step, const char *const *tags, const double *values, int n,
                        snug_error *e);

void snug_tboard_close(snug_tboard *tb);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's mask of it. */
uint32_t snug_crc32c(const void *p, size_t n);
uint32_t snug_crc32c_masked(const void *p, size_t n);

#endif
