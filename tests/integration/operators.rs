//! The one operator table: docs/delegate.md lists exactly its nodes (the graph builder checks
//! each node it writes against it, in debug builds).

use std::path::Path;
use xnnblob::delegate::operators::OPERATORS;

#[test]
fn the_docs_list_exactly_the_operator_table() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/delegate.md"))
            .unwrap();
    let list = doc
        .split_once("<!-- operators -->")
        .and_then(|(_, rest)| rest.split_once("<!-- /operators -->"))
        .expect("docs/delegate.md has an operators list")
        .0;
    let documented: Vec<(String, String)> = list
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .map(|l| {
            let (node, rest) = l.split_once("`: `").expect("- `NODE`: `call`");
            let call = rest.split_once('`').expect("closing backtick").0;
            (node.to_string(), call.to_string())
        })
        .collect();
    let table: Vec<(String, String)> = OPERATORS
        .iter()
        .map(|o| (o.node.to_string(), o.xnnpack.to_string()))
        .collect();
    assert_eq!(
        documented, table,
        "docs/delegate.md's list must follow src/delegate/operators/"
    );
}
