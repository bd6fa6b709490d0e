# outbox-relay - build, test and tooling.
#
#   make            bin/outbox-relay, bin/outboxctl, lib/liboutbox.a, lib/liboutbox.so.0
#   make test       unit tests, then integration tests against throwaway servers
#   make test-ha    multi-node tests (tests/ha): failover, clusters; longer, run by CI too
#   make asan       the same tests built with AddressSanitizer + UBSan
#   make valgrind   the same tests under valgrind (leaks are errors)
#   make demo       a throwaway stack, producers, the relay, a consumer
#   make bench      the benchmark
#   make fuzz       libFuzzer targets in tests/fuzz, FUZZ_SECONDS each (needs clang)
#                   (FUZZ_TARGETS="url config" picks some)
#   make torture    randomized histories and faults over every broker and both modes, judged
#                   by an independent checker (TORTURE_SECONDS, TORTURE_SEED, TORTURE_BROKERS,
#                   TORTURE_MODES, TORTURE_RELAYS, TORTURE_SELFTEST: tests/torture/torture.py)
#   make soak       the fault-injection driver for SOAK_SECONDS (600) per broker, then
#                   the table's long-run health under 5 000 rows/s (tests/bench/longrun.sh)
#   make deps       install the Debian packages this needs (as root)
#   make install    programs, library, header, pkg-config file, SQL, man pages and the
#                   systemd unit under DESTDIR + PREFIX (default /usr/local)
#   make deb        outbox-relay, liboutbox0 and liboutbox-dev _VERSION_ARCH.deb in DEB_OUT
#   make image      the container image (Containerfile) as IMAGE, with podman or docker
#   make test-image build the image and run it against throwaway servers, the compose file
#                   under podman-compose, helm lint and template (tests/container)
#   make format / analyze / clean

VERSION   := 0.2.0
SOVERSION := 0
# liboutbox (src/) needs libpq alone. The relay adds its broker clients: a new broker's
# pkg-config name goes in RELAY_PKGS. PKGS is everything the relay and the tests link.
LIB_PKGS   := libpq
RELAY_PKGS := librabbitmq hiredis uuid libnats rdkafka
PKGS      := $(LIB_PKGS) $(RELAY_PKGS)
TEST_PKGS := cmocka

# BUILD holds objects and test binaries; BIN and LIB the products.
BUILD ?= build
BIN   ?= bin
LIB   ?= lib

CC       ?= cc
OPT      ?= -O2 -g
SAN      ?=
WARNINGS := -std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wformat=2 -Wwrite-strings -Wno-format-nonliteral -Werror
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LIB_CFLAGS = $(shell pkg-config --cflags $(LIB_PKGS) 2>/dev/null)
LIB_LIBS   = $(shell pkg-config --libs $(LIB_PKGS) 2>/dev/null)
TEST_CFLAGS = $(shell pkg-config --cflags $(TEST_PKGS) 2>/dev/null)
TEST_LIBS   = $(shell pkg-config --libs $(TEST_PKGS) 2>/dev/null)

CPPFLAGS += -D_GNU_SOURCE -DOUTBOX_VERSION='"$(VERSION)"' $(MUTANT_FLAGS)
# Each product sees its own headers and the library's, never another product's: the
# dependencies run one way, relay/ and outboxctl/ -> common/ -> src/ -> libpq. src/ is
# liboutbox, what a producer links; common/ what the two programs share beyond it (the
# HTTP server, JSON, the stream's and the list's stores, option parsing), never linked
# into liboutbox; src/ cannot see common/'s headers.
LIB_INCLUDES    = -Isrc $(LIB_CFLAGS)
COMMON_INCLUDES = -Icommon -Isrc $(LIB_CFLAGS)
RELAY_INCLUDES  = -Irelay -Irelay/sink -Icommon -Isrc $(PKG_CFLAGS)
CTL_INCLUDES    = -Ioutboxctl -Icommon -Isrc $(LIB_CFLAGS)
CFLAGS   += $(WARNINGS) $(OPT) $(SAN) -pthread -MMD -MP
LDFLAGS  += $(SAN)
LDLIBS   += $(PKG_LIBS) -pthread -lm

# The library's objects are position-independent: one set serves liboutbox.a and .so.
LIB_SRC   := $(sort $(wildcard src/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
COMMON_SRC := $(sort $(wildcard common/*.c))
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
LIB_SO    := $(LIB)/liboutbox.so.$(SOVERSION)
# sql/NNN_name.sql, embedded in the library as C strings (see src/migrate.h).
MIGRATIONS    := $(sort $(wildcard sql/[0-9][0-9][0-9]_*.sql))
MIGRATION_OBJ := $(BUILD)/gen/migrations.o
# relay/ is the daemon (its broker modules in relay/sink/), outboxctl/ the admin command
# line; both link the library's objects and common/'s (LIB_INTERNAL). The relay's modules but main also make build/librelay.a,
# which the tests link.
RELAY_SRC := $(sort $(wildcard relay/*.c relay/sink/*.c))
RELAY_OBJ := $(RELAY_SRC:%.c=$(BUILD)/%.o)
RELAY_MAIN_OBJ := $(BUILD)/relay/outbox_relay.o
RELAY_LIB := $(BUILD)/librelay.a
CTL_SRC   := $(sort $(wildcard outboxctl/*.c))
CTL_OBJ   := $(CTL_SRC:%.c=$(BUILD)/%.o)

UNIT_SRC   := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit/%)
INTEG_SRC  := $(sort $(wildcard tests/integration/test_*.c))
INTEG_BIN  := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/integration/%)
INTEG_HELPERS := $(filter-out $(INTEG_SRC),$(sort $(wildcard tests/integration/*.c)))
INTEG_HELPER_OBJ := $(INTEG_HELPERS:%.c=$(BUILD)/%.o)
# tests/ha: multi-node deployments, linked like the integration tests plus tests/ha's own
# helpers and the chaos driver (for its audit of fenced writes).
HA_SRC     := $(sort $(wildcard tests/ha/test_*.c))
HA_BIN     := $(HA_SRC:tests/ha/%.c=$(BUILD)/tests/ha/%)
# tests/chaos: the fault-injection driver and its TCP proxy, linked into test_chaos.
CHAOS_SRC  := $(sort $(wildcard tests/chaos/*.c))
CHAOS_OBJ  := $(CHAOS_SRC:%.c=$(BUILD)/%.o)
HA_HELPERS := $(filter-out $(HA_SRC),$(sort $(wildcard tests/ha/*.c)))
HA_HELPER_OBJ := $(HA_HELPERS:%.c=$(BUILD)/%.o)
TOOL_SRC   := $(sort $(wildcard tests/tools/*.c))
TOOL_BIN   := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/tools/%)
# tests/tools/common: what several tools share, linked into each.
TOOL_HELPER_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tests/tools/common/*.c)))

PRODUCTS := $(BIN)/outbox-relay $(BIN)/outboxctl $(LIB)/liboutbox.a $(LIB_SO) $(LIB)/liboutbox.so

.PHONY: all test test-ha mutants unit integration test-binaries asan valgrind demo bench soak torture fuzz deps \
        format analyze clean check-deps install man deb image image-offline test-image console-screenshot

all: check-deps $(PRODUCTS)

check-deps:
	@pkg-config --exists $(PKGS) || { echo "missing build dependencies: run 'make deps' (as root)"; \
	    echo "or install: $$(tests/harness/deps.sh --list)"; exit 2; }

# The installed static library defines, like the shared one, only the functions outbox.h
# declares: its objects are linked into one relocatable object whose other global names
# (buffer_clear, parse_integer, store_*...) objcopy makes local, so they cannot clash with
# an application's own. The relay, outboxctl and the tests use those internals: they link
# LIB_INTERNAL: the same objects as they are, and common/'s.
LIB_INTERNAL := $(BUILD)/liboutbox-internal.a
OBJCOPY ?= objcopy

$(LIB)/liboutbox.a: $(LIB_OBJ) $(MIGRATION_OBJ) $(BUILD)/gen/liboutbox.symbols Makefile
	@mkdir -p $(@D)
	rm -f $@
	$(CC) -r -nostdlib -o $(BUILD)/gen/liboutbox.o $(LIB_OBJ) $(MIGRATION_OBJ)
	$(OBJCOPY) --keep-global-symbols=$(BUILD)/gen/liboutbox.symbols $(BUILD)/gen/liboutbox.o
	$(AR) rcs $@ $(BUILD)/gen/liboutbox.o

$(LIB_INTERNAL): $(LIB_OBJ) $(COMMON_OBJ) $(MIGRATION_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

# The shared library exports the functions outbox.h declares and nothing else; linked
# with --no-undefined, so a dependency beyond libpq and libc fails here.
$(LIB_SO): $(LIB_OBJ) $(MIGRATION_OBJ) $(BUILD)/gen/liboutbox.map
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,$(@F) -Wl,--version-script=$(BUILD)/gen/liboutbox.map \
	    -Wl,--no-undefined -o $@ $(LIB_OBJ) $(MIGRATION_OBJ) $(LIB_LIBS) -pthread -lm

$(LIB)/liboutbox.so: $(LIB_SO)
	ln -sf $(<F) $@

$(BUILD)/gen/liboutbox.map: src/outbox.h
	@mkdir -p $(@D)
	{ echo '{'; echo '  global:'; \
	  sed -n 's/^[A-Za-z].*[ *]\(outbox_[a-z0-9_]*\)(.*/    \1;/p' src/outbox.h | sort -u; \
	  echo '  local: *;'; echo '};'; } > $@.tmp
	mv $@.tmp $@

# The same names, one a line, for objcopy.
$(BUILD)/gen/liboutbox.symbols: src/outbox.h
	@mkdir -p $(@D)
	sed -n 's/^[A-Za-z].*[ *]\(outbox_[a-z0-9_]*\)(.*/\1/p' src/outbox.h | sort -u > $@.tmp
	mv $@.tmp $@

$(RELAY_LIB): $(filter-out $(RELAY_MAIN_OBJ),$(RELAY_OBJ))
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BIN)/outbox-relay: $(RELAY_MAIN_OBJ) $(RELAY_LIB) $(LIB_INTERNAL)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(RELAY_MAIN_OBJ) $(RELAY_LIB) $(LIB_INTERNAL) $(LDLIBS)

# outboxctl links libpq alone: it depends on no broker client.
$(BIN)/outboxctl: $(CTL_OBJ) $(LIB_INTERNAL)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(CTL_OBJ) $(LIB_INTERNAL) $(LIB_LIBS) -pthread -lm

# sql is a prerequisite so that adding or removing a file rebuilds the list.
$(BUILD)/gen/migrations.c: $(MIGRATIONS) sql sql/embed-migrations.sh
	@mkdir -p $(@D)
	sql/embed-migrations.sh $(MIGRATIONS) > $@.tmp
	mv $@.tmp $@

$(MIGRATION_OBJ): $(BUILD)/gen/migrations.c
	$(CC) $(LIB_INCLUDES) $(CPPFLAGS) $(CFLAGS) -fPIC -c -o $@ $<

$(BUILD)/src/%.o: src/%.c
	@mkdir -p $(@D)
	$(CC) $(LIB_INCLUDES) $(CPPFLAGS) $(CFLAGS) -fPIC -c -o $@ $<

$(BUILD)/common/%.o: common/%.c
	@mkdir -p $(@D)
	$(CC) $(COMMON_INCLUDES) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/relay/%.o: relay/%.c
	@mkdir -p $(@D)
	$(CC) $(RELAY_INCLUDES) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/outboxctl/%.o: outboxctl/%.c
	@mkdir -p $(@D)
	$(CC) $(CTL_INCLUDES) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# Any other source (a tool, a helper) sees every product's headers.
$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(RELAY_INCLUDES) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# Tests see every product's headers and link the relay's modules and the library.
TEST_LINK = $(RELAY_LIB) $(LIB_INTERNAL)

$(BUILD)/tests/%.o: tests/%.c
	@mkdir -p $(@D)
	$(CC) $(RELAY_INCLUDES) $(CPPFLAGS) -Itests/integration -Itests/chaos -Itests/ha $(TEST_CFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(TEST_LINK) $(TEST_LIBS) $(LDLIBS)

$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(INTEG_HELPER_OBJ) $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(INTEG_HELPER_OBJ) $(TEST_LINK) $(TEST_LIBS) $(LDLIBS)

$(BUILD)/tests/integration/test_chaos: $(BUILD)/tests/integration/test_chaos.o $(CHAOS_OBJ) \
                                      $(INTEG_HELPER_OBJ) $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(CHAOS_OBJ) $(INTEG_HELPER_OBJ) $(TEST_LINK) $(TEST_LIBS) $(LDLIBS)

# the tenants' tests put a slow-connecting proxy (tests/chaos/proxy.c) before PostgreSQL
$(BUILD)/tests/integration/test_relay_databases_tenants: \
        $(BUILD)/tests/integration/test_relay_databases_tenants.o $(CHAOS_OBJ) \
        $(INTEG_HELPER_OBJ) $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(CHAOS_OBJ) $(INTEG_HELPER_OBJ) $(TEST_LINK) $(TEST_LIBS) $(LDLIBS)

$(BUILD)/tests/ha/%: $(BUILD)/tests/ha/%.o $(HA_HELPER_OBJ) $(CHAOS_OBJ) $(INTEG_HELPER_OBJ) \
                    $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(HA_HELPER_OBJ) $(CHAOS_OBJ) $(INTEG_HELPER_OBJ) $(TEST_LINK) \
	    $(TEST_LIBS) $(LDLIBS)

$(BUILD)/tests/tools/%: $(BUILD)/tests/tools/%.o $(TOOL_HELPER_OBJ) $(TEST_LINK)
	$(CC) $(LDFLAGS) -o $@ $< $(TOOL_HELPER_OBJ) $(TEST_LINK) $(LDLIBS)

.SECONDARY:

test-binaries: $(PRODUCTS) $(UNIT_BIN) $(INTEG_BIN) $(HA_BIN) $(TOOL_BIN)

# The relay with its planted defects (src/mutant.h) for the mutation gate of `make test`
# (tests/torture/test_mutants.sh): its own build directory, never bin/; OUTBOX_MUTANTS is
# defined nowhere else.
MUTANT_VARS := BUILD=build-mutants BIN=build-mutants/bin LIB=build-mutants/lib \
               MUTANT_FLAGS=-DOUTBOX_MUTANTS
mutants:
	$(MAKE) $(MUTANT_VARS) build-mutants/bin/outbox-relay

# `make test` installs missing packages first when run as root, and builds on every core.
test:
	tests/harness/deps.sh
	$(MAKE) -j"$$(nproc)" test-binaries mutants
	BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) tests/run.sh

unit: test-binaries
	BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) tests/run.sh unit

integration: test-binaries mutants
	BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) tests/run.sh integration

test-ha:
	tests/harness/deps.sh
	$(MAKE) test-binaries
	BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) tests/run.sh ha

ASAN_VARS := BUILD=build-asan BIN=build-asan/bin LIB=build-asan/lib OPT="-O1 -g" \
             SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
asan:
	tests/harness/deps.sh
	$(MAKE) $(ASAN_VARS) test-binaries
	$(MAKE) mutants
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 $(ASAN_VARS) tests/run.sh

VALGRIND_VARS := BUILD=build-valgrind BIN=build-valgrind/bin LIB=build-valgrind/lib OPT="-O0 -g"
valgrind:
	tests/harness/deps.sh
	$(MAKE) $(VALGRIND_VARS) test-binaries
	$(MAKE) mutants
	OUTBOX_VALGRIND="valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=99" \
	    OUTBOX_TEST_JOBS=1 $(VALGRIND_VARS) tests/run.sh

# The demo builds what it runs (the programs and four test tools), on every core, while its
# servers start; KEEP=1 leaves the stack running at the end with a relay and the console.
DEMO_TOOLS := $(addprefix $(BUILD)/tests/tools/,outbox_producer outbox_consumer nats_bench \
                kafka_throughput)
demo:
	tests/harness/deps.sh
	@$(MAKE) --no-print-directory check-deps
	BUILD=$(BUILD) BIN=$(BIN) KEEP=$(KEEP) \
	    DEMO_BUILD='$(MAKE) --no-print-directory -j'"$$(nproc)"' BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) $(PRODUCTS) $(DEMO_TOOLS)' \
	    tests/demo.sh

bench:
	tests/harness/deps.sh
	$(MAKE) OPT="-O2" all $(TOOL_BIN)
	BUILD=$(BUILD) BIN=$(BIN) tests/bench/run.sh

# docs/console.png again, from a console over three seeded databases (not a test; starts
# its own PostgreSQL unless OUTBOX_TEST_PG_URL names one).
console-screenshot: all
	BUILD=$(BUILD) BIN=$(BIN) tests/browser/screenshot.sh docs/console.png

# The torture run starts its own servers; every setting comes from the environment.
torture:
	tests/harness/deps.sh
	$(MAKE) all
	BIN=$(BIN) LIB=$(LIB) /usr/bin/python3 tests/torture/torture.py

# libFuzzer targets: tests/fuzz/fuzz_<name>.c against the library sources,
# all compiled by clang with the fuzzer, address and undefined sanitizers.
# Only `make fuzz` needs clang.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 30
FUZZ_BUILD   := build-fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS   = $(WARNINGS) -O1 -g $(FUZZ_SAN) -pthread
FUZZ_SRC     := $(sort $(wildcard tests/fuzz/fuzz_*.c))
# `make fuzz FUZZ_TARGETS="url parse"` runs only those
FUZZ_TARGETS ?= $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_BIN     := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o) $(COMMON_SRC:%.c=$(FUZZ_BUILD)/%.o) \
                $(filter-out $(FUZZ_BUILD)/relay/outbox_relay.o,$(RELAY_SRC:%.c=$(FUZZ_BUILD)/%.o))

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(RELAY_INCLUDES) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

$(FUZZ_BUILD)/liboutbox-fuzz.a: $(FUZZ_LIB_OBJ)
	rm -f $@
	$(AR) rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_BUILD)/liboutbox-fuzz.a
	$(FUZZ_CC) $(RELAY_INCLUDES) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< \
	    $(FUZZ_BUILD)/liboutbox-fuzz.a $(PKG_LIBS) -pthread -lm

fuzz: check-deps
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang with libFuzzer:" \
	    "apt-get install clang libclang-rt-14-dev"; exit 2; }
	$(MAKE) $(FUZZ_BIN)
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_BIN)

# The chaos driver for SOAK_SECONDS per broker, judging the relay's RSS and fds too; then
# the long-run health of outbox.job (steady load for SOAK_SECONDS, and the vacuum horizon).
SOAK_SECONDS ?= 600
soak:
	tests/harness/deps.sh
	$(MAKE) test-binaries
	BUILD=$(BUILD) BIN=$(BIN) SOAK_SECONDS=$(SOAK_SECONDS) tests/chaos/soak.sh
	BUILD=$(BUILD) BIN=$(BIN) LONGRUN_SECONDS=$(SOAK_SECONDS) tests/bench/longrun.sh steady
	BUILD=$(BUILD) BIN=$(BIN) tests/bench/longrun.sh horizon

deps:
	tests/harness/deps.sh

# Installation layout; the Debian package sets PREFIX=/usr and the multiarch LIBDIR.
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    ?= $(PREFIX)/share/outbox-relay
DOCDIR     ?= $(PREFIX)/share/doc/outbox-relay
MANDIR     ?= $(PREFIX)/share/man
UNITDIR    ?= $(PREFIX)/lib/systemd/system

# Man pages come from --help, which comes from the option table: they cannot drift.
MAN_PAGES := $(BUILD)/man/outbox-relay.8 $(BUILD)/man/outboxctl.1
man: $(MAN_PAGES)

$(BUILD)/man/outbox-relay.8: $(BIN)/outbox-relay deploy/man/mkman.sh deploy/man/outbox-relay.8.in
	@mkdir -p $(@D)
	$(BIN)/outbox-relay --help | VERSION=$(VERSION) deploy/man/mkman.sh outbox-relay 8 \
	    "publish PostgreSQL outbox rows to RabbitMQ or Redis Streams" > $@.tmp
	mv $@.tmp $@

$(BUILD)/man/outboxctl.1: $(BIN)/outboxctl deploy/man/mkman.sh deploy/man/outboxctl.1.in
	@mkdir -p $(@D)
	$(BIN)/outboxctl --help | VERSION=$(VERSION) deploy/man/mkman.sh outboxctl 1 \
	    "administer an outbox-relay database: migrate, status, dead rows, enqueue" > $@.tmp
	mv $@.tmp $@

SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
            -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' -e 's|@VERSION@|$(VERSION)|g'

install: all man
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(DATADIR)/sql/roles $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8 \
	    $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)/examples
	install -m 755 $(BIN)/outbox-relay $(BIN)/outboxctl $(DESTDIR)$(BINDIR)/
	install -m 644 $(LIB)/liboutbox.a $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIB_SO)) $(DESTDIR)$(LIBDIR)/liboutbox.so
	install -m 644 src/outbox.h $(DESTDIR)$(INCLUDEDIR)/
	$(SUBST) deploy/outbox.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/outbox.pc
	install -m 644 $(MIGRATIONS) $(DESTDIR)$(DATADIR)/sql/
	install -m 644 sql/roles/*.sql $(DESTDIR)$(DATADIR)/sql/roles/
	install -m 644 $(BUILD)/man/outbox-relay.8 $(DESTDIR)$(MANDIR)/man8/
	install -m 644 $(BUILD)/man/outboxctl.1 $(DESTDIR)$(MANDIR)/man1/
	$(SUBST) deploy/systemd/outbox-relay@.service.in > $(DESTDIR)$(UNITDIR)/outbox-relay@.service
	chmod 644 $(DESTDIR)$(UNITDIR)/outbox-relay@.service
	install -m 644 deploy/systemd/outbox-relay.env $(DESTDIR)$(DOCDIR)/examples/
	$(SUBST) deploy/systemd/credentials.conf > $(DESTDIR)$(DOCDIR)/examples/credentials.conf
	chmod 644 $(DESTDIR)$(DOCDIR)/examples/credentials.conf
	install -m 644 deploy/prometheus/outbox-relay.rules.yml deploy/grafana/outbox-relay.json \
	    $(DESTDIR)$(DOCDIR)/examples/

# Debian packages with dpkg-deb from a staged `make install` (deploy/debian/build-deb.sh).
DEB_OUT ?= $(BUILD)/deb
deb: all man
	VERSION=$(VERSION) BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) DEB_OUT=$(DEB_OUT) \
	    deploy/debian/build-deb.sh

# The container image: podman when installed, else docker. IMAGE_BUILD_ARGS adds to the
# build, e.g. --build-arg BASE_IMAGE=debian:12-slim (the default). Podman writes the docker
# format, the one that keeps HEALTHCHECK.
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE            ?= outbox-relay:$(VERSION)
IMAGE_REVISION   ?= $(or $(shell git rev-parse HEAD 2>/dev/null),unknown)
IMAGE_SOURCE     ?= $(or $(shell git remote get-url origin 2>/dev/null),unknown)
IMAGE_BUILD_ARGS ?=
image:
	$(CONTAINER_ENGINE) build $(if $(filter podman,$(notdir $(CONTAINER_ENGINE))),--format docker) \
	    -f Containerfile -t $(IMAGE) --build-arg VERSION=$(VERSION) \
	    --build-arg REVISION=$(IMAGE_REVISION) --build-arg SOURCE=$(IMAGE_SOURCE) $(IMAGE_BUILD_ARGS) .

# Without a container registry (air-gapped): the same image from bases made of Debian 12
# packages by mmdebstrap (a Debian mirror, DEBIAN_MIRROR=URL for an internal one), podman only.
# IMAGE_OFFLINE_ARGS adds to the build.
image-offline:
	IMAGE=$(IMAGE) VERSION=$(VERSION) IMAGE_REVISION=$(IMAGE_REVISION) IMAGE_SOURCE=$(IMAGE_SOURCE) \
	    deploy/container/image-offline.sh $(IMAGE_OFFLINE_ARGS)

# Installs podman, podman-compose and mmdebstrap when run as root; takes helm's release binary
# (checksum-verified) from the npm registry, else builds it with go.
test-image:
	tests/container/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

analyze:
	cppcheck --std=c11 --enable=warning,performance,portability --error-exitcode=1 \
	    --suppress=missingIncludeSystem --inline-suppr -D_GNU_SOURCE -Isrc -Icommon -Irelay -Irelay/sink \
	    -Ioutboxctl src common relay outboxctl

clean:
	rm -rf build build-asan build-valgrind build-fuzz bin lib

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
