#!/usr/bin/env bash
# Checks the layering of tests/layers.bzl against Bazel's dependency graph:
#  1. every package whose libraries appear in the graph belongs to a layer;
#  2. no library depends on a library of a layer its own layer may not use (core/ops must not
#     reach core/io or core/text, cache must not reach core/nn or attention, and so on);
#  3. PEFT composes the base model's own attention, cache and model targets.
# Usage: layering_test.sh LAYERS_TXT (PACKAGE DEPS_FILE)...
set -euo pipefail
layers_txt=$1
shift
fail=0

declare -A layer_of allowed_of
while read -r package layer allowed; do  # package as //core/ops, or // for the root
  layer_of[$package]=$layer
  allowed_of[$layer]=$allowed
done <"$layers_txt"

checked=0
libraries=0
while [ "$#" -gt 0 ]; do
  package=$1 deps_file=$2
  shift 2
  layer=${layer_of[$package]}
  [ -s "$deps_file" ] || { echo "FAIL: $deps_file is empty"; fail=1; continue; }
  while read -r dep; do
    case "$dep" in //*) ;; *) continue ;; esac  # external libraries (@...)
    dep_package=${dep%%:*}
    if [ "$dep_package" = "$package" ]; then libraries=$((libraries + 1)); continue; fi
    if [ -z "${layer_of[$dep_package]+set}" ]; then
      echo "FAIL: $dep (used by $package) is in a package of no layer"; fail=1; continue
    fi
    dep_layer=${layer_of[$dep_package]}
    checked=$((checked + 1))
    case ",${allowed_of[$layer]}," in
      *",$dep_layer,"*) ;;
      *) echo "FAIL: $package (layer $layer) depends on $dep (layer $dep_layer)"; fail=1 ;;
    esac
  done <"$deps_file"
  if [ "$package" = //peft ]; then
    for needed in //attention:causal_self_attention //cache:kv_cache //core/model:gpt; do
      grep -qx "$needed" "$deps_file" || { echo "FAIL: peft does not reach $needed"; fail=1; }
    done
  fi
done
# Guards against a vacuous pass (empty genqueries, a broken table).
[ "$libraries" -gt 50 ] || { echo "FAIL: only $libraries libraries seen"; fail=1; }
[ "$checked" -gt 100 ] || { echo "FAIL: only $checked cross-package dependencies checked"; fail=1; }
[ "$fail" = 0 ] && echo "layering ok: $libraries libraries, $checked cross-package dependencies"
exit $fail
