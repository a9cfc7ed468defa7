/* main.c: the snug command line. */
#include <stdio.h>
int main(void) { puts("snug"); return 0; }
