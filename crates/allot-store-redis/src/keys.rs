//! The hash tags of keys: every key of a namespace starts with [`prefix`], and every key of a
//! pool with `allot:pool:` and its [`hash_tag`], so that each namespace and each pool lives in
//! one hash slot whatever its name holds (`lua/namespace.lua` and `lua/pool.lua` list the keys).

use allot_core::NamespaceName;

/// The key prefix of a namespace. Its hash tag is the namespace name with `%`, `{` and `}`
/// escaped, so that every key of the namespace hashes to one slot whatever the name holds.
pub(crate) fn prefix(namespace: &NamespaceName) -> String {
    format!("allot:{}", hash_tag(namespace.as_str()))
}

/// `{name}` with `%`, `{` and `}` of the name escaped, so the hash tag is never empty or cut
/// short: every key that starts with it hashes to one slot.
pub(crate) fn hash_tag(name: &str) -> String {
    let mut tag = String::with_capacity(name.len() + 2);
    tag.push('{');
    for c in name.chars() {
        match c {
            '%' => tag.push_str("%25"),
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            c => tag.push(c),
        }
    }
    tag.push('}');
    tag
}

/// The name a hash tag was made of (`{name}`, escaped as [`hash_tag`] escapes it).
pub(crate) fn unescape_tag(tag: &str) -> Option<String> {
    let inner = tag.strip_prefix('{')?.strip_suffix('}')?;
    Some(inner.replace("%7B", "{").replace("%7D", "}").replace("%25", "%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_keep_one_hash_tag_whatever_the_name() {
        let p = prefix(&NamespaceName::new("}a{b%").unwrap());
        assert_eq!(p, "allot:{%7Da%7Bb%25}");
        assert_eq!(prefix(&NamespaceName::new("hive:cluster-a").unwrap()), "allot:{hive:cluster-a}");
        for name in ["}a{b%", "%7B", "plain"] {
            assert_eq!(unescape_tag(&hash_tag(name)).as_deref(), Some(name));
        }
    }
}
