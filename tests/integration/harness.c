/*
 * harness.c - helpers for integration tests against the throwaway stack.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "harness.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Databases made by this process so far; part of each new database's name. */
static unsigned database_counter;

const char *
harness_env(const char *name)
{
    const char *value = getenv(name);

    if (value == NULL || value[0] == '\0') {
        fail_msg("environment variable %s is not set: run integration tests through tests/run.sh "
                 "(make test or make integration)",
                 name);
    }
    return value;
}

/* Sleeps for ms milliseconds. */
static void
sleep_ms(long ms)
{
    struct timespec delay = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

    while (nanosleep(&delay, &delay) == -1 && errno == EINTR)
        ;
}

/*
 * Returns a malloc'd copy of base_url (a postgresql:// URL ending in /database) with
 * its database replaced by database.
 */
static char *
url_with_database(const char *base_url, const char *database)
{
    const char *authority = strstr(base_url, "://");
    const char *slash;
    char *url;
    size_t prefix;

    if (authority == NULL)
        fail_msg("OUTBOX_TEST_PG_URL is not a postgresql:// URL");
    slash = strchr(authority + 3, '/');
    prefix = slash != NULL ? (size_t)(slash - base_url) : strlen(base_url);
    url = malloc(prefix + 1 + strlen(database) + 1);
    assert_non_null(url);
    memcpy(url, base_url, prefix);
    url[prefix] = '/';
    strcpy(url + prefix + 1, database);
    return url;
}

/* Returns the database name at the end of url (after its last slash, before any '?'). */
static char *
database_of_url(const char *url)
{
    const char *slash = strrchr(url, '/');
    size_t length;
    char *name;

    if (slash == NULL)
        fail_msg("no database name in test database url");
    length = strcspn(slash + 1, "?");
    name = strndup(slash + 1, length);
    assert_non_null(name);
    return name;
}

/* Runs sql on the maintenance database (postgres) of the test server. */
static PGresult *
maintenance_exec(const char *sql)
{
    PGconn *conn = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    PGresult *result = PQexec(conn, sql);

    /* The result outlives the connection; the caller reads its status and message. */
    PQfinish(conn);
    return result;
}

/*
 * Creates a new uniquely named database with CREATE DATABASE ... TEMPLATE template
 * and returns a URL to it. Retries for a while when the template is busy (another
 * process cloning or reading it at that moment).
 */
static char *
database_new(const char *template)
{
    char name[64];
    char sql[256];
    int attempt;

    snprintf(name, sizeof(name), "outbox_test_%ld_%u", (long)getpid(), ++database_counter);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s TEMPLATE %s", name, template);
    for (attempt = 0;; attempt++) {
        PGresult *result = maintenance_exec(sql);
        const char *sqlstate;

        if (PQresultStatus(result) == PGRES_COMMAND_OK) {
            PQclear(result);
            break;
        }
        sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
        /* 55006 object_in_use: someone is connected to the template right now. */
        if (attempt < 100 && sqlstate != NULL && strcmp(sqlstate, "55006") == 0) {
            PQclear(result);
            sleep_ms(100);
            continue;
        }
        fail_msg("unable to create test database %s from %s: %s", name, template,
                 PQresultErrorMessage(result));
    }
    return url_with_database(harness_env("OUTBOX_TEST_PG_URL"), name);
}

char *
harness_database_new(void)
{
    return database_new(harness_env("OUTBOX_TEST_TEMPLATE_DB"));
}

char *
harness_database_new_empty(void)
{
    return database_new("template0");
}

void
harness_database_drop(char *url)
{
    char sql[256];
    char *name;
    PGresult *result;

    if (url == NULL)
        return;
    name = database_of_url(url);
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", name);
    result = maintenance_exec(sql);
    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        char message[512];

        snprintf(message, sizeof(message), "%s", PQresultErrorMessage(result));
        PQclear(result);
        free(name);
        free(url);
        fail_msg("unable to drop test database: %s", message);
    }
    PQclear(result);
    free(name);
    free(url);
}

PGconn *
harness_connect(const char *url)
{
    PGconn *conn = PQconnectdb(url);

    if (conn == NULL)
        fail_msg("unable to connect to the test database: out of memory");
    if (PQstatus(conn) != CONNECTION_OK) {
        char message[512];

        snprintf(message, sizeof(message), "%s", PQerrorMessage(conn));
        PQfinish(conn);
        fail_msg("unable to connect to the test database: %s", message);
    }
    return conn;
}

void
harness_exec(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    ExecStatusType status = PQresultStatus(result);

    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        char message[512];

        snprintf(message, sizeof(message), "%s", PQresultErrorMessage(result));
        PQclear(result);
        fail_msg("sql failed: %s\n  %s", message, sql);
    }
    PQclear(result);
}

long long
harness_query_ll(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    long long value;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        char message[512];

        snprintf(message, sizeof(message), "%s", PQresultErrorMessage(result));
        PQclear(result);
        fail_msg("query failed: %s\n  %s", message, sql);
    }
    if (PQntuples(result) < 1 || PQnfields(result) < 1 || PQgetisnull(result, 0, 0)) {
        PQclear(result);
        fail_msg("query returned no value: %s", sql);
    }
    value = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    PQclear(result);
    return value;
}

void
harness_message_id(PGconn *conn, long long job_id, int replay, char *out, size_t size)
{
    char job[24];
    const char *params[1] = {job};
    PGresult *result;
    int n;

    snprintf(job, sizeof(job), "%lld", job_id);
    result = PQexecParams(conn,
                          "SELECT CASE i.id_form WHEN 'job' THEN j.job_id::text"
                          " WHEN 'database' THEN i.database_id || ':' || i.epoch || ':' || j.job_id"
                          " ELSE i.database_id || ':' || j.message_uid END"
                          " FROM outbox.identity AS i, outbox.job AS j WHERE j.job_id = $1",
                          1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1 ||
        PQgetisnull(result, 0, 0)) {
        PQclear(result);
        fail_msg("unable to read outbox.identity and the message_uid of job %lld", job_id);
    }
    n = snprintf(out, size, "%s", PQgetvalue(result, 0, 0));
    if (replay > 0 && n > 0 && (size_t)n < size)
        snprintf(out + n, size - (size_t)n, ".r%d", replay);
    PQclear(result);
}

char *
harness_log_path(const char *name)
{
    const char *stack_dir = harness_env("OUTBOX_TEST_STACK_DIR");
    size_t size = strlen(stack_dir) + strlen(name) + 16;
    char *path = malloc(size);

    assert_non_null(path);
    snprintf(path, size, "%s/logs", stack_dir);
    if (mkdir(path, 0755) == -1 && errno != EEXIST)
        fail_msg("unable to create %s: %s", path, strerror(errno));
    snprintf(path, size, "%s/logs/%s.log", stack_dir, name);
    return path;
}

/*
 * Returns a malloc'd NULL-terminated argv: the space-separated words of prefix (may be
 * NULL), then argv. words receives the malloc'd copy of prefix the entries point into.
 */
static char **
argv_with_prefix(const char *prefix, const char *const argv[], char **words)
{
    size_t count = 0, argc = 0, i = 0;
    char **full;
    char *word, *save = NULL;

    *words = strdup(prefix != NULL ? prefix : "");
    if (*words == NULL)
        return NULL;
    for (const char *p = *words; *p != '\0'; p++) {
        if (*p != ' ' && (p == *words || p[-1] == ' '))
            count++;
    }
    while (argv[argc] != NULL)
        argc++;
    full = calloc(count + argc + 1, sizeof(*full));
    if (full == NULL)
        return NULL;
    for (word = strtok_r(*words, " ", &save); word != NULL; word = strtok_r(NULL, " ", &save))
        full[i++] = word;
    for (size_t a = 0; a < argc; a++)
        full[i++] = (char *)argv[a];
    full[i] = NULL;
    return full;
}

pid_t
harness_spawn(const char *const argv[], const char *log_path)
{
    pid_t parent = getpid();
    pid_t pid;
    char *words = NULL;
    char **full;

    assert_non_null(argv);
    assert_non_null(argv[0]);
    /* Built before fork: the child only opens, dups and execs. */
    full = argv_with_prefix(getenv("OUTBOX_VALGRIND"), argv, &words);
    assert_non_null(full);
    fflush(NULL);
    pid = fork();
    if (pid == -1) {
        free(full);
        free(words);
        fail_msg("unable to fork for %s: %s", argv[0], strerror(errno));
    }
    if (pid == 0) {
        int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

        /* A program a failed test leaves behind must not outlive the test binary. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (log_fd == -1 || null_fd == -1)
            _exit(127);
        if (dup2(null_fd, STDIN_FILENO) == -1 || dup2(log_fd, STDOUT_FILENO) == -1 ||
            dup2(log_fd, STDERR_FILENO) == -1)
            _exit(127);
        execvp(full[0], full);
        dprintf(STDERR_FILENO, "harness: unable to run %s: %s\n", full[0], strerror(errno));
        _exit(127);
    }
    free(full);
    free(words);
    return pid;
}

int
harness_wait_exit(pid_t pid, int timeout_ms)
{
    int status;
    long waited_ms = 0;

    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);

        if (done == pid)
            break;
        if (done == -1 && errno != EINTR)
            fail_msg("unable to wait for process %ld: %s", (long)pid, strerror(errno));
        if (waited_ms >= timeout_ms) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) == -1 && errno == EINTR)
                ;
            return -1;
        }
        sleep_ms(10);
        waited_ms += 10;
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

int
harness_stack(const char *command, const char *service)
{
    const char *source_dir = harness_env("OUTBOX_SOURCE_DIR");
    const char *stack_dir = harness_env("OUTBOX_TEST_STACK_DIR");
    char script[4096];
    pid_t pid;
    int status;

    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh", source_dir);
    fflush(NULL);
    pid = fork();
    if (pid == -1)
        fail_msg("unable to fork for stack.sh: %s", strerror(errno));
    if (pid == 0) {
        execl(script, script, command, stack_dir, service, (char *)NULL);
        dprintf(STDERR_FILENO, "harness: unable to run %s: %s\n", script, strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, &status, 0) == -1) {
        if (errno != EINTR)
            fail_msg("unable to wait for stack.sh: %s", strerror(errno));
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int
harness_stack_run(const char *const args[])
{
    const char *source_dir = harness_env("OUTBOX_SOURCE_DIR");
    const char *stack_dir = harness_env("OUTBOX_TEST_STACK_DIR");
    const char *argv[32];
    char script[4096];
    size_t n = 0;
    pid_t pid;
    int status;

    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh", source_dir);
    argv[n++] = script;
    argv[n++] = args[0];
    argv[n++] = stack_dir;
    for (size_t i = 1; args[i] != NULL && n < sizeof(argv) / sizeof(argv[0]) - 1; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid = fork();
    if (pid == -1)
        fail_msg("unable to fork for stack.sh: %s", strerror(errno));
    if (pid == 0) {
        execv(script, (char *const *)argv);
        dprintf(STDERR_FILENO, "harness: unable to run %s: %s\n", script, strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, &status, 0) == -1) {
        if (errno != EINTR)
            fail_msg("unable to wait for stack.sh: %s", strerror(errno));
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void
harness_stack_load_env(void)
{
    char path[4096], line[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/env", harness_env("OUTBOX_TEST_STACK_DIR"));
    f = fopen(path, "r");
    if (f == NULL)
        fail_msg("unable to read %s: %s", path, strerror(errno));
    while (fgets(line, sizeof(line), f) != NULL) {
        char *name, *value, *end;

        /* export NAME=value or export NAME='value', as stack.sh writes them */
        if (strncmp(line, "export ", 7) != 0 || (value = strchr(line, '=')) == NULL)
            continue;
        name = line + 7;
        *value++ = '\0';
        value[strcspn(value, "\n")] = '\0';
        if (value[0] == '\'' && (end = strrchr(value + 1, '\'')) != NULL) {
            *end = '\0';
            value++;
        }
        setenv(name, value, 1);
    }
    fclose(f);
}

int
harness_closed_port(void)
{
    struct sockaddr_in address = {.sin_family = AF_INET};
    socklen_t length = sizeof(address);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port;

    assert_true(fd >= 0);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&address, sizeof(address)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&address, &length), 0);
    port = ntohs(address.sin_port);
    close(fd);
    return port;
}

int
harness_free_port(void)
{
    static int given[256];
    static size_t given_count;
    const char *range = getenv("OUTBOX_TEST_PORT_RANGE");
    int low = 20000, high = 32000;

    if (range != NULL && (sscanf(range, "%d-%d", &low, &high) != 2 || low <= 0 || high < low))
        fail_msg("OUTBOX_TEST_PORT_RANGE=%s: LOW-HIGH expected", range);
    if (given_count == 0)
        srand((unsigned)getpid() ^ (unsigned)time(NULL));
    for (int attempt = 0; attempt < 500; attempt++) {
        struct sockaddr_in address = {.sin_family = AF_INET};
        int port = low + rand() % (high - low + 1);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        bool taken = false;

        for (size_t i = 0; i < given_count && !taken; i++)
            taken = given[i] == port;
        assert_true(fd >= 0);
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons((uint16_t)port);
        if (!taken && bind(fd, (struct sockaddr *)&address, sizeof(address)) == 0) {
            close(fd);
            if (given_count < sizeof(given) / sizeof(given[0]))
                given[given_count++] = port;
            return port;
        }
        close(fd);
    }
    fail_msg("no free loopback port in %d-%d", low, high);
    return -1;
}

int
harness_time_scale(void)
{
    const char *prefix = getenv("OUTBOX_VALGRIND");

    return prefix != NULL && prefix[0] != '\0' ? 10 : 1;
}
