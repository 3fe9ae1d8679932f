#!/usr/bin/env bash
# Regenerates docs/EXPANSION.md from the expansion snapshots (tests/docs.rs checks it is current).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  cat scripts/expansion-doc-head.md
  cat macros/tests/snapshots/linear_single_tensor.rs
  echo '```'
  echo
  echo 'A whole model, from `macros/tests/snapshots/chained_model.rs`:'
  echo
  echo '```rust'
  cat macros/tests/snapshots/chained_model.rs
  echo '```'
  echo
  echo 'And the struct form with a schedule, from `macros/tests/snapshots/two_stage_schedule.rs`:'
  echo
  echo '```rust'
  cat macros/tests/snapshots/two_stage_schedule.rs
  echo '```'
  echo
  echo 'An inference module (an impl without `backward`: no grad surfaces, no `backward` on the'
  echo 'wrapper, `has_backward` false), from `macros/tests/snapshots/inference_module.rs`:'
  echo
  echo '```rust'
  cat macros/tests/snapshots/inference_module.rs
  echo '```'
} > docs/EXPANSION.md
