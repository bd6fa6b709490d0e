/*
 * test_database_list.c - the --databases list (common/database_list.c): lines
 * "NAME URL" and bare URLs, comments, and the mistakes that refuse the file
 * whole with the line named and no URL quoted.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "database_list.h"

static void
test_names_urls_and_comments(void **state)
{
    struct database_list list;
    struct outbox_error err;
    const char *text = "# tenants\n"
                       "\n"
                       "acme   postgresql://relay@db1/acme   # the first\n"
                       "  postgresql://relay@db2:5433/initech?sslmode=disable\n"
                       "globex\thost=db3 dbname=globex user=relay\n"
                       "dbname=conninfo_only";

    (void)state;
    assert_int_equal(database_list_parse(text, "--databases f", &list, &err), 0);
    assert_int_equal(list.count, 4);
    assert_string_equal(list.items[0].name, "acme");
    assert_string_equal(list.items[0].url, "postgresql://relay@db1/acme");
    assert_string_equal(list.items[1].name, "initech"); /* a bare URL names itself */
    assert_string_equal(list.items[2].name, "globex");
    assert_string_equal(list.items[2].url, "host=db3 dbname=globex user=relay");
    assert_string_equal(list.items[3].name, "conninfo_only");
    assert_non_null(database_list_find(&list, "globex"));
    assert_null(database_list_find(&list, "nobody"));
    database_list_clear(&list);
    database_list_clear(&list); /* clearing twice is harmless */
}

static void
expect_refused(const char *text, const char *needle)
{
    struct database_list list;
    struct outbox_error err;

    assert_int_equal(database_list_parse(text, "--databases f", &list, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    if (strstr(err.message, needle) == NULL)
        fail_msg("'%s' does not say '%s'", err.message, needle);
    assert_null(strstr(err.message, "secret")); /* never a password */
    assert_int_equal(list.count, 0);
}

static void
test_mistakes_name_the_line(void **state)
{
    (void)state;
    expect_refused("a postgresql://u:secret@h/a\na postgresql://u:secret@h/b\n",
                   "--databases f line 2: the name 'a' is listed twice");
    expect_refused("a postgresql://u:secret@h/x\nb postgresql://u:secret@h/x\n",
                   "line 2: the URL of 'a' is listed twice");
    expect_refused("# ok\nbad/name postgresql://u:secret@h/a\n", "line 2: the name must be");
    expect_refused("postgresql://u:secret@h/\n", "line 1: the URL names no database");
    expect_refused("t postgresql://u:secret@h/a?no_such_setting=1\n", "line 1:");
}

static void
test_file_stamp_sees_a_change(void **state)
{
    char path[] = "/tmp/test_database_list_XXXXXX";
    int fd = mkstemp(path);
    struct database_file_stamp before, after;
    struct database_list list;
    struct outbox_error err;

    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "a postgresql://h/a\n", 19), 19);
    before = database_file_stamp(path);
    assert_int_equal(database_list_read(path, &list, &err), 0);
    assert_int_equal(list.count, 1);
    database_list_clear(&list);
    assert_int_equal(write(fd, "b postgresql://h/b\n", 19), 19);
    close(fd);
    after = database_file_stamp(path);
    assert_true(database_file_changed(&before, &after));
    assert_false(database_file_changed(&after, &after));
    unlink(path);
    assert_true(database_file_changed(&after, &(struct database_file_stamp){0}));
    assert_int_equal(database_list_read(path, &list, &err), -1);
    assert_non_null(strstr(err.message, path));
}

static void
test_single_url_and_copy(void **state)
{
    struct database_list one, copy;

    (void)state;
    assert_int_equal(database_list_single("postgresql://relay@db1/acme", &one), 0);
    assert_int_equal(one.count, 1);
    assert_string_equal(one.items[0].name, "acme");
    assert_int_equal(database_list_copy(&one, &copy), 0);
    database_list_clear(&one);
    assert_int_equal(copy.count, 1); /* the copy owns its entries */
    assert_string_equal(copy.items[0].name, "acme");
    assert_string_equal(copy.items[0].url, "postgresql://relay@db1/acme");
    database_list_clear(&copy);
    /* a URL naming no database, or one no name may be, is "default" */
    assert_int_equal(database_list_single("host=db1 user=relay", &one), 0);
    assert_string_equal(one.items[0].name, "default");
    database_list_clear(&one);
    assert_int_equal(database_list_single("dbname='my db'", &one), 0);
    assert_string_equal(one.items[0].name, "default");
    assert_string_equal(one.items[0].url, "dbname='my db'");
    database_list_clear(&one);
}

/*
 * A '#' starts a comment at a line's start or after a blank only: within a
 * URL's password it is the password's (the line was cut there, the relay
 * started without the database, and libpq's reason quoted the password's
 * start as a port); a conninfo value in single quotes keeps its " #".
 */
static void
test_hash_in_a_password(void **state)
{
    struct database_list list;
    struct outbox_error err;
    const char *text = "#tenants\n"
                       "acme postgresql://relay:S3cr#AB@db1:5432/acme # the first\n"
                       "postgresql://relay:x#y@db2/initech\n"
                       "globex host=db3 dbname=globex password='a #b\\' #c' # the third\n"
                       "  # indented comment\n";

    (void)state;
    assert_int_equal(database_list_parse(text, "--databases f", &list, &err), 0);
    assert_int_equal(list.count, 3);
    assert_string_equal(list.items[0].url, "postgresql://relay:S3cr#AB@db1:5432/acme");
    assert_string_equal(list.items[1].name, "initech");
    assert_string_equal(list.items[2].url, "host=db3 dbname=globex password='a #b\\' #c'");
    database_list_clear(&list);
}

/* libpq's reason for a bad URL quotes what it could not read: never a password's part. */
static void
test_refusal_quotes_no_value(void **state)
{
    struct database_list list;
    struct outbox_error err;

    (void)state;
    /* a password's bad escape: libpq quotes the whole token */
    assert_int_equal(database_list_parse("acme postgresql://relay:S3cr%zzAB@db1/acme\n",
                                         "--databases f", &list, &err),
                     -1);
    assert_null(strstr(err.message, "S3cr"));
    assert_non_null(strstr(err.message, "line 1"));
    /* a password cut by a blank reads as an option */
    assert_int_equal(database_list_parse("acme host=db1 password=S3cr AB=1 dbname=acme\n",
                                         "--databases f", &list, &err),
                     -1);
    assert_null(strstr(err.message, "S3cr"));
}

/* Writes text into a new file named from path's template (…XXXXXX). */
static void
write_list_file(char *path, const char *text)
{
    int fd = mkstemp(path);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* A file emptied (or caught while rewritten in place) is refused, not read as "no databases". */
static void
test_empty_file_refused(void **state)
{
    char path[] = "/tmp/outbox-list-XXXXXX";
    struct database_list list;
    struct outbox_error err;

    (void)state;
    write_list_file(path, "# nothing\n\n");
    assert_int_equal(database_list_read(path, &list, &err), -1);
    if (strstr(err.message, "lists no database") == NULL)
        fail_msg("%s", err.message);
    assert_int_equal(list.count, 0);
    unlink(path);
}

/*
 * A file whose last line has no newline is refused: a list cut short (a copy
 * stopped midway, a disk full, a writer caught mid-write) leaves a partial
 * last line, which read whole could be a shorter valid URL (another
 * database, a host without its port). The list as read before it stays.
 */
static void
test_partial_last_line_refused(void **state)
{
    static const char cut[] = "a postgresql://u@127.0.0.1:5432/tenant_1\n"
                              "b postgresql://u@127.0.0.1:54";
    char path[] = "/tmp/outbox-list-XXXXXX";
    struct database_list list;
    struct outbox_error err;
    int fd;

    (void)state;
    write_list_file(path, cut);
    assert_int_equal(database_list_read(path, &list, &err), -1);
    if (strstr(err.message, "no newline") == NULL)
        fail_msg("%s", err.message);
    assert_null(strstr(err.message, "54")); /* the partial line is not quoted */
    assert_int_equal(list.count, 0);
    /* the same lines whole are read */
    fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "32/tenant_2\n", 12), 12);
    close(fd);
    assert_int_equal(database_list_read(path, &list, &err), 0);
    assert_int_equal(list.count, 2);
    database_list_clear(&list);
    unlink(path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_urls_and_comments),
        cmocka_unit_test(test_mistakes_name_the_line),
        cmocka_unit_test(test_file_stamp_sees_a_change),
        cmocka_unit_test(test_single_url_and_copy),
        cmocka_unit_test(test_hash_in_a_password),
        cmocka_unit_test(test_refusal_quotes_no_value),
        cmocka_unit_test(test_empty_file_refused),
        cmocka_unit_test(test_partial_last_line_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
