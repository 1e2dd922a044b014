//! The line of a field in a YAML file, for errors found after merge keys were resolved.
//!
//! A file with merge keys (`<<: *defaults`) is read into a tree, the merges applied, and the
//! tree deserialized: that last step knows the path of a bad field
//! (`descriptors[1].rate_limit.unit`, through `serde_path_to_error`) but not its line. This
//! walks the path again in the file's own text, merges unapplied, and takes the line the parser
//! is at where the path ends: the field itself, or, for a field a merge brought in, the deepest
//! mapping of the path the file writes out (the one holding the `<<`). Sequences keep their
//! indices under merges, so the walk never lands on another descriptor.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_path_to_error::Segment;

/// The error that ends the walk where the path ends (never shown).
const FOUND: &str = "distlimit-server: path located";

/// The 1-based line of `path` in `yaml`, or of the deepest part of it the text has; `None`
/// when the text cannot be read (its own error then has the line). A `message` starting with
/// an index (`[2]: duplicate descriptor ...`, from a list's own check) goes one step deeper.
pub(crate) fn line_of(
    yaml: &str,
    path: &serde_path_to_error::Path,
    message: &str,
) -> Option<usize> {
    let mut segments: Vec<Segment> = path.iter().cloned().collect();
    let index = message
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("]:"))
        .and_then(|(index, _)| index.parse().ok());
    if let Some(index) = index {
        segments.push(Segment::Seq { index });
    }
    let segments: Vec<&Segment> = segments.iter().collect();
    let error = Walk { rest: &segments }
        .deserialize(serde_yaml_ng::Deserializer::from_str(yaml))
        .err()?;
    error.location().map(|l| l.line())
}

/// Follows `rest` down the document, failing where it ends (the parser's position is the line).
struct Walk<'p, 's> {
    rest: &'p [&'s Segment],
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn found<E: de::Error>() -> E {
    E::custom(FOUND)
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    // A scalar or null: the path ends here, and serde's default `visit_*` answers an error
    // (never shown) at the parser's position, as `found` does.

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Segment::Seq { index }, rest)) = self.rest.split_first() else {
            return Err(found());
        };
        for _ in 0..*index {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(found());
            }
        }
        seq.next_element_seed(Walk { rest })?;
        Err(found())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Segment::Map { key }, rest)) = self.rest.split_first() else {
            return Err(found());
        };
        while let Some(name) = map.next_key::<serde_yaml_ng::Value>()? {
            if name.as_str() == Some(key.as_str()) {
                map.next_value_seed(Walk { rest })?;
                return Err(found());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(found())
    }
}
