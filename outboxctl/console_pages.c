/*
 * console_pages.c - the page table and the routing of page requests (see
 * console_pages.h). The top of the pages: it names every page's handler,
 * and no page calls back here (their header links come from
 * console->pages, which console.c points at this table).
 */
#include <string.h>

#include "console_html.h"
#include "console_pages.h"

const struct console_page console_pages[] = {
    /* clang-format off */
    /* path          title              header link        database open   handler */
    {"/",            "Overview",        "Overview",        true,    false, console_overview_page},
    {"/dead",        "Dead rows",       "Dead rows",       true,    false, console_dead_page},
    {"/keys",        "Keys and pauses", "Keys and pauses", true,    false, console_keys_page},
    {"/replay",      "Replay",          "Replay",          false,   false, console_replay_page},
    {"/databases",   "Databases",       "Databases",       false,   false, console_databases_page},
    {"/login",       "Log in",          NULL,              false,   true,  console_login_page},
    {"/logout",      "Log out",         NULL,              false,   true,  console_logout_page},
    /* clang-format on */
};

const size_t console_page_count = sizeof(console_pages) / sizeof(console_pages[0]);

void
console_html(struct console *console, struct console_request *request,
             struct console_response *response)
{
    const struct console_page *page = NULL;
    PGconn *conn = NULL;

    for (size_t i = 0; i < console_page_count && page == NULL; i++)
        if (strcmp(console_pages[i].path, request->path) == 0)
            page = &console_pages[i];
    if ((page == NULL || !page->open) && request->identity == CONSOLE_NOBODY)
        return console_login_page(console, NULL, request, response);
    if (page == NULL)
        return console_respond_text(response, 404, "not found");
    if (page->database &&
        (conn = console_database(request->database, request->database_url)) == NULL)
        return console_page_banner(console, request, response, page->title, page->path,
                                   console_database_error());
    page->show(console, conn, request, response);
}
