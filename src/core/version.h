/* version.h: snug's version, which the public header (include/snug.h) announces and each checkpoint records. */
#ifndef SNUG_CORE_VERSION_H
#define SNUG_CORE_VERSION_H

#define SNUG_VERSION "0.1.0"

#endif
