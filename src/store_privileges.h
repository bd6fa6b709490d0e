/*
 * store_privileges.h - the privilege audit: every privilege the rows of
 * store_statements[] need, checked once at connect so a missing grant is
 * one clear configuration error instead of a failure mid-batch.
 */
#ifndef OUTBOX_STORE_PRIVILEGES_H
#define OUTBOX_STORE_PRIVILEGES_H

#include <stdbool.h>

#include "store_exec.h"

/* A privilege role lacks: OUTBOX_ERR_CONFIG, SQLSTATE 42501; returns -1. */
int store_missing_privilege(struct outbox_error *err, const char *role, const char *what);
/* Whether a privilege audit counts DELETE (retention) among the needs. */
enum privilege_audit { AUDIT_WITHOUT_DELETE, AUDIT_WITH_DELETE };

/* The first privilege of store_statements[] the session lacks, DELETE only when audit asks. */
int store_check_privileges(outbox_store *store, enum privilege_audit audit,
                           struct outbox_error *err);

#endif
