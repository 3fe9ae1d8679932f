//! The docs quote generated code; keep them true to the checked-in expansion snapshots.

#[test]
fn expansion_doc_quotes_the_current_snapshots() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/EXPANSION.md")).expect("docs/EXPANSION.md");
    for snap in ["linear_single_tensor.rs", "chained_model.rs", "two_stage_schedule.rs"] {
        let text = std::fs::read_to_string(format!("{root}/macros/tests/snapshots/{snap}")).expect("snapshot");
        assert!(
            doc.contains(text.trim()),
            "docs/EXPANSION.md no longer quotes macros/tests/snapshots/{snap}; regenerate it (see scripts/gen-expansion-doc.sh)"
        );
    }
}
