//! Compile-time diagnostics of the macros (trybuild): each `ui-tests/fail/<case>.rs` must fail
//! with exactly its `.stderr`, each `ui-tests/pass/<case>.rs` must build and run.
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/fail/*.rs");
    t.pass("ui-tests/pass/*.rs");
}
