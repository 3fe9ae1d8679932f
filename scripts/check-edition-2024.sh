#!/usr/bin/env bash
# Builds the graphed package's tests and examples and runs its doc tests as edition 2024 (what
# `cargo new` makes), in a copy of the tracked files, so code users copy from the examples and
# docs, and what #[graphed] generates in their crates, is checked in that edition too. The
# package itself stays edition 2021 (its formatting follows the 2021 style).
set -euo pipefail
cd "$(dirname "$0")/.."
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git ls-files -z | xargs -0 tar -cf - | tar -C "$copy" -xf -
sed -i 's/^edition = "2021"/edition = "2024"/' "$copy/Cargo.toml"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/edition-2024}"
cd "$copy"
cargo build --tests --examples
cargo test --doc
echo "edition 2024: tests, examples and doc tests build"
