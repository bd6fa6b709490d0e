/*
 * console_page.c - the layout every page of the console shares: its head,
 * the header's links (from the page table, console_pages.c, which
 * console->pages points at) carrying the page's database=NAME, with a list
 * of databases a selector that switches it, the banner of a database that
 * is away, and HTML escaping. Calls no page: the pages stand on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_page.h"

void
console_html_escape(struct buffer *out, const char *text)
{
    if (text == NULL)
        return;
    for (const char *p = text; *p != '\0'; p++) {
        switch (*p) {
        case '&': buffer_puts(out, "&amp;"); break;
        case '<': buffer_puts(out, "&lt;"); break;
        case '>': buffer_puts(out, "&gt;"); break;
        case '"': buffer_puts(out, "&quot;"); break;
        case '\'': buffer_puts(out, "&#39;"); break;
        default: buffer_putc(out, *p);
        }
    }
}

void
console_html_database_param(struct buffer *out, const struct console_request *request,
                            char separator)
{
    if (request->database[0] == '\0')
        return;
    buffer_puts(out, separator == '&' ? "&amp;database=" : "?database=");
    /* a name is [A-Za-z0-9_.-]: nothing to percent-encode */
    console_html_escape(out, request->database);
}

/* With a list of databases: the form that switches the page to another database. */
static void
database_selector(struct console *console, const struct console_request *request,
                  struct buffer *out, const char *current)
{
    struct database_list list;
    char error[OUTBOX_ERROR_MESSAGE_MAX];

    if (console->databases.file == NULL ||
        console_databases_copy(&console->databases, &list, error, sizeof(error)) != 0)
        return;
    buffer_printf(out,
                  "<form method=\"get\" action=\"%s\" class=\"database\"><label>Database "
                  "<select name=\"database\" id=\"database\" data-switch>",
                  current[0] != '\0' ? current : "/");
    for (size_t i = 0; i < list.count; i++) {
        buffer_puts(out, "<option value=\"");
        console_html_escape(out, list.items[i].name);
        buffer_puts(out,
                    strcmp(list.items[i].name, request->database) == 0 ? "\" selected>" : "\">");
        console_html_escape(out, list.items[i].name);
        buffer_puts(out, "</option>");
    }
    buffer_puts(out, "</select></label> <button type=\"submit\">Switch</button></form>");
    database_list_clear(&list);
}

void
console_page_start(struct console *console, const struct console_request *request,
                   struct buffer *out, const char *title, const char *current)
{
    buffer_puts(out, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                     "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                     "<title>");
    console_html_escape(out, title);
    buffer_puts(out, " - outbox console</title><meta name=\"csrf-token\" content=\"");
    if (request->session != NULL)
        console_html_escape(out, request->session->csrf);
    buffer_puts(out, "\"><link rel=\"stylesheet\" href=\"/static/console.css\">"
                     "<script src=\"/static/console.js\" defer></script></head>\n<body>"
                     "<header><span class=\"brand\">outbox console</span><nav>");
    for (size_t i = 0; i < console->page_count; i++) {
        const struct console_page *page = &console->pages[i];

        if (page->nav == NULL)
            continue;
        buffer_printf(out, "<a href=\"%s", page->path);
        console_html_database_param(out, request, '?');
        buffer_printf(out, "\"%s>%s</a>",
                      strcmp(page->path, current) == 0 ? " class=\"current\"" : "", page->nav);
    }
    buffer_puts(out, "</nav>");
    if (request->identity != CONSOLE_NOBODY)
        database_selector(console, request, out, current);
    buffer_printf(out, "<span class=\"mode\">%s</span>",
                  console->allow_actions ? "actions allowed" : "read-only");
    if (request->identity == CONSOLE_COOKIE)
        buffer_puts(out, "<form method=\"post\" action=\"/logout\" class=\"logout\">"
                         "<button type=\"submit\">Log out</button></form>");
    buffer_puts(out, "</header>\n<p id=\"message\" role=\"status\"></p>\n<main>");
}

void
console_page_end(struct buffer *out)
{
    buffer_puts(out, "</main></body></html>\n");
}

void
console_page_respond(struct console_response *response, int status)
{
    response->status = status;
    response->content_type = "text/html; charset=utf-8";
}

/* The banner of a page whose database is away; answers 503. */
void
console_page_banner(struct console *console, const struct console_request *request,
                    struct console_response *response, const char *title, const char *current,
                    const char *message)
{
    struct buffer *out = &response->body;

    out->len = 0;
    console_page_start(console, request, out, title, current);
    buffer_puts(out, "<div class=\"banner\" id=\"database-banner\">Database unavailable: ");
    console_html_escape(out, message);
    buffer_puts(out, ". The console reconnects at the next request; reload to try again.</div>");
    console_page_end(out);
    console_page_respond(response, 503);
}

bool
console_table_open(struct buffer *out, const char *title, size_t rows, const char *empty,
                   const char *id, const char *const columns[])
{
    buffer_printf(out, "<h2>%s</h2>", title);
    if (rows == 0) {
        buffer_printf(out, "<p class=\"note\">%s</p>", empty);
        return false;
    }
    buffer_printf(out, "<table id=\"%s\"><thead><tr>", id);
    for (size_t i = 0; columns[i] != NULL; i++)
        buffer_printf(out, "<th>%s</th>", columns[i]);
    buffer_puts(out, "</tr></thead><tbody>");
    return true;
}
