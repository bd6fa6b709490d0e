/*
 * console_assets.h - the stylesheet and script embedded in the binary and
 * served under /static/, the only ones the pages load.
 */
#ifndef OUTBOX_CONSOLE_ASSETS_H
#define OUTBOX_CONSOLE_ASSETS_H


/* The embedded /static/ files: NULL when name is not one. */
const char *console_asset(const char *name, const char **content_type);

#endif
