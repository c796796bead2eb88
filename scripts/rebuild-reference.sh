#!/usr/bin/env bash
# Re-create a committed compact reference (results/reference/<name>) from its own contents
# with today's code: its rows, tables, manifest and config laid out as a study directory,
# then `tiledattn bundle create --compact` run from a checkout of the revision its workflow
# snapshot was taken at (so the snapshot, and the README's install lines, stay that
# revision's). Run from the repository root, in the environment whose tiledattention should
# write the bundle (PYTHONPATH=$PWD for a checkout):
#   scripts/rebuild-reference.sh results/reference/h100 results/reference/h200
# Refuses a reference whose README names no snapshot revision; the old bundle is replaced
# only when bundle create succeeded. Needs git history holding the revision.
set -euo pipefail
root=$(pwd)
[ -f Snakefile ] || { echo "rebuild-reference: run from the repository root" >&2; exit 2; }
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
for ref in "$@"; do
  [ -f "$ref/README.md" ] && [ -f "$ref/manifest.json" ] || {
    echo "rebuild-reference: $ref: not a committed reference (no README.md, manifest.json)" >&2
    exit 2; }
  rev=$(sed -n 's/.*the source is that of the repository this bundle is committed in at revision \([0-9a-f]\{40\}\).*/\1/p' "$ref/README.md" | head -1)
  [ -n "$rev" ] || { echo "rebuild-reference: $ref: its README names no snapshot revision" >&2; exit 2; }
  s="$work/study"; rm -rf "$s"
  mkdir -p "$s/aggregate/tables" "$s/ladder" "$s/model" "$s/variants"
  gunzip -c "$ref/data/rows.jsonl.gz" > "$s/aggregate/rows.jsonl"
  cp "$ref/data/columns.md" "$s/aggregate/columns.md"
  cp "$ref"/tables/*.md "$s/aggregate/tables/"
  cp "$ref/manifest.json" "$s/manifest.json"
  gunzip -c "$ref/data/ladder-rows.jsonl.gz" > "$s/ladder/rows-shard0of1.jsonl"
  gunzip -c "$ref/data/model-rows.jsonl.gz" > "$s/model/rows.jsonl"
  gunzip -c "$ref/data/variants-rows.jsonl.gz" > "$s/variants/rows.jsonl"
  for g in "$ref"/data/shapes-g*-rows.jsonl.gz; do
    n=$(basename "$g" | sed 's/^shapes-\(g[0-9]*\)-rows.jsonl.gz$/\1/')
    mkdir -p "$s/shapes/$n"; gunzip -c "$g" > "$s/shapes/$n/rows-shard0of1.jsonl"
  done
  git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1 || true
  git -C "$root" worktree add --quiet --detach "$work/src" "$rev"
  (cd "$work/src" && tiledattn bundle create --study "$s" \
     --config "$root/$ref/config/study-config.yaml" --out "$work/new" --compact)
  rm -rf "$root/$ref.old"; mv "$root/$ref" "$root/$ref.old"
  cp -a "$work/new" "$root/$ref"
  rm -rf "$root/$ref.old" "$work/new" "$work/new.zip"
  echo "rebuild-reference: $ref re-created (snapshot revision $rev)"
done
