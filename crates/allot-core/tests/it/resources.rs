//! The resource text form against `testdata/resources.json`, the table of cases that the Python
//! client's and the dashboard's tests check their own readers against: this one is the reference.

use std::collections::BTreeMap;

use allot_core::Resources;
use serde_json::Value;

const TABLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/resources.json");

#[test]
fn the_text_form_reads_as_the_shared_table_says() {
    let table: Value = serde_json::from_str(&std::fs::read_to_string(TABLE).unwrap()).unwrap();
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() > 40, "the table has its cases");
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let parsed = text.parse::<Resources>();
        if let Some(error) = case["error"].as_str() {
            let got = parsed.expect_err(text);
            // The variant's name, as `Debug` starts it: `Duplicate { name: "cpu" }`.
            let variant = format!("{got:?}");
            assert!(variant.split([' ', '(']).next() == Some(error), "`{text}`: {variant}, not {error}");
            continue;
        }
        let got: BTreeMap<String, u64> =
            parsed.unwrap_or_else(|e| panic!("`{text}`: {e}")).iter().map(|(n, m)| (n.to_string(), m)).collect();
        let want: BTreeMap<String, u64> =
            case["milli"].as_object().unwrap().iter().map(|(n, m)| (n.clone(), m.as_u64().unwrap())).collect();
        assert_eq!(got, want, "`{text}`");
    }
}
