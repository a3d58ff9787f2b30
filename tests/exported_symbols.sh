#!/usr/bin/env bash
# libccoll.so exports exactly the functions include/ccoll.h declares with CC_API: no C++ internals (the ifuncs of
# target_clones functions, template instantiations) that another library could bind to or clash with.
#
#   tests/exported_symbols.sh LIBCCOLL_SO HEADER [NM]      (exit 0: the same set; 1: the differences listed)
set -euo pipefail
lib=$1
header=$2
nm=${3:-nm}
declared=$(tr '\n' ' ' < "$header" | grep -oE 'CC_API[^;(]*[[:space:]*]cc[A-Za-z0-9_]+[[:space:]]*\(' |
  grep -oE 'cc[A-Za-z0-9_]+[[:space:]]*\($' | tr -d ' (' | sort -u || true)
exported=$("$nm" -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
if [ -z "$declared" ]; then
  echo "no CC_API functions found in $header"
  exit 1
fi
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
[ -n "$extra" ] && printf 'exported but not declared in %s:\n%s\n' "$header" "$extra"
[ -n "$missing" ] && printf 'declared in %s but not exported:\n%s\n' "$header" "$missing"
if [ -n "$extra$missing" ]; then
  exit 1
fi
echo "$(echo "$declared" | wc -l) functions exported, each declared in $(basename "$header"), nothing else"
