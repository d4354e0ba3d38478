#!/bin/bash
# The documentation against the code:
#  - usrc(7) and usrc(8) format without groff warnings;
#  - every environment variable the code reads is documented in one of them
#    (the X-macro tunables are generated into usrc(7); the few read with a
#    getenv of their own are written by hand and must not be forgotten);
#  - every USRC_* name README.md, docs/ and the man pages mention exists
#    (an environment variable the code reads, a CMake variable or a macro);
#  - every counter of the X-macro is in usrc(7);
#  - every subcommand of the usrc CLI, and every word `link add` takes, is
#    in usrc(8).
# Usage: man_test.sh SOURCE_DIR GENERATED_USRC_7 USRC_CLI
set -uo pipefail
SRC=$1 MAN7=$2 USRC=$3
MAN8=$SRC/man/usrc.8
errors=0
fail() { echo "FAIL: $*"; errors=$((errors + 1)); }

[ -s "$MAN7" ] || { echo "FAIL: $MAN7 was not generated"; exit 1; }

if command -v groff >/dev/null; then
  for page in "$MAN7" "$MAN8"; do
    out=$(groff -man -ww -z -Tutf8 "$page" 2>&1)
    [ -z "$out" ] || fail "groff warns about $page: $out"
  done
else
  echo "groff not installed: formatting not checked"
fi

# Read by the code: the X-macro's names and every getenv("USRC_...").
read_env=$( (grep -ohE '^ *X\([a-z0-9_]+, [a-z0-9_]+, "USRC_[A-Z0-9_]+"' \
               "$SRC/providers/usrc/common/tunables.h" | grep -oE 'USRC_[A-Z0-9_]+'
             grep -rohE 'getenv\("USRC_[A-Z0-9_]+"' "$SRC/providers" "$SRC/tools" "$SRC/include" |
               grep -oE 'USRC_[A-Z0-9_]+') | sort -u)
[ "$(echo "$read_env" | wc -l)" -ge 15 ] || fail "found too few variables in the code: $read_env"
for v in $read_env; do
  grep -qE "^\.B $v\$" "$MAN7" "$MAN8" || fail "$v is read by the code but in neither usrc(7) nor usrc(8)"
done

# Mentioned by the docs: must exist.
# (or a CMake variable or definition, or a macro of the code: USRC_TUNABLES)
cmake_vars=$( (grep -rhoE 'USRC_[A-Z0-9_]+' --include=CMakeLists.txt "$SRC"
              grep -rhoE '#define USRC_[A-Z0-9_]+' "$SRC/providers" "$SRC/include" |
                grep -oE 'USRC_[A-Z0-9_]+') | sort -u)
for f in "$SRC/README.md" "$SRC"/docs/*.md "$MAN7" "$MAN8"; do
  [ -e "$f" ] || continue
  for v in $(grep -ohE 'USRC_[A-Z0-9_]+' "$f" | sort -u); do
    echo "$read_env $cmake_vars" | tr ' ' '\n' | grep -qx "$v" ||
      fail "$(basename "$f") mentions $v, which the code does not read"
  done
done

for c in $(grep -oE '^ *X\([a-z_]+, "' "$SRC/include/usrc/device.h" | grep -oE '[a-z_]+,' | tr -d ,); do
  grep -qE "^\.B $c\$" "$MAN7" || fail "counter $c is not in usrc(7)"
done

subs=$("$USRC" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF {print $1}')
[ -n "$subs" ] || fail "no subcommands in usrc --help"
for s in $subs; do grep -qE "^\.B usrc $s( |\$)" "$MAN8" || fail "usrc $s is not in usrc(8)'s synopsis"; done
link_subs=$("$USRC" link --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF {print $1}')
for s in $link_subs; do grep -qE "^\.B usrc link $s( |\$)" "$MAN8" || fail "usrc link $s is not in usrc(8)"; done
add_words=$("$USRC" link --help | grep -E '^ *add ' | grep -oE '\[[a-z]+' | tr -d '[')
for w in netdev $add_words; do
  grep -qE "^\.RB? (\[ )?$w( |\$)|^\.B $w\$" "$MAN8" || fail "link add's '$w' is not in usrc(8)"
done

[ "$errors" = 0 ] || exit 1
echo PASS
