# Building and installing with make, as PGXN's client does (`pgxn install pg_fencing`, or
# `pgxn install ./pg_fencing-<version>.zip` from a downloaded archive): `make` builds the release
# library for the PostgreSQL that PG_CONFIG names (15 or 18) with cargo-pgrx 0.18.1 (installed
# and initialised by scripts/setup.sh, or by hand: docs/operations.md, "Install"); `make install`
# puts it and the control file and SQL scripts into that PostgreSQL's directories, each as a new
# file renamed over the old one (a running server keeps its mapping of the old library).
# DESTDIR is honoured; TARGET is cargo's target directory (default target, or target/pg18).
PG_CONFIG ?= pg_config
PG_MAJOR := $(shell $(PG_CONFIG) --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
ifeq ($(PG_MAJOR),15)
FEATURES :=
TARGET ?= target
else ifeq ($(PG_MAJOR),18)
FEATURES := --no-default-features --features pg18
TARGET ?= target/pg18
else
$(error pg_fencing builds for PostgreSQL 15 and 18, not "$(PG_MAJOR)" ($(PG_CONFIG)))
endif
PKGLIBDIR := $(shell $(PG_CONFIG) --pkglibdir)
EXTDIR := $(shell $(PG_CONFIG) --sharedir)/extension
BUILT = $(TARGET)/release/pg_fencing-pg$(PG_MAJOR)

all:
	CARGO_TARGET_DIR=$(TARGET) cargo pgrx package $(FEATURES) --pg-config $(PG_CONFIG)

# Only copies what `make` built (PGXN's client runs it with --sudo as root, where cargo may not
# be on PATH and a build would leave root-owned files).
install:
	@test -f $(BUILT)$(PKGLIBDIR)/pg_fencing.so || { echo "nothing built for PostgreSQL $(PG_MAJOR): run make first" >&2; exit 1; }
	mkdir -p $(DESTDIR)$(PKGLIBDIR) $(DESTDIR)$(EXTDIR)
	for f in $(BUILT)$(PKGLIBDIR)/pg_fencing.so $(BUILT)$(EXTDIR)/pg_fencing*; do \
	    case "$$f" in *.so) d=$(DESTDIR)$(PKGLIBDIR) ;; *) d=$(DESTDIR)$(EXTDIR) ;; esac; \
	    cp "$$f" "$$d/.$$(basename "$$f").new" && mv -f "$$d/.$$(basename "$$f").new" "$$d/$$(basename "$$f")" || exit 1; \
	done

.PHONY: all install
