//! A request's `ProfilesDictionary` as it fills: every string, mapping,
//! function, location, attribute and stack once, referred to by its
//! index; index 0 of each table is that table's zero value, as the proto
//! requires, so that 0 means "none".

use std::collections::HashMap;

use super::proto::{
    any_value::Value, AnyValue, Function, KeyValueAndUnit, Line, Link, Location, Mapping,
    ProfilesDictionary, Stack,
};

/// A frame as a location: what code it is and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// `profile.frame.type` (`kernel`, `native`, `jvm`, `cpython`...).
    pub ty: &'static str,
    /// The mapping's file name: the kind of code where no file is known.
    pub mapping: &'static str,
    pub function: &'a str,
    /// The function's file and first line, where known (Python).
    pub file: &'a str,
    pub line: i64,
}

/// An attribute's value, hashable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Attr {
    Str(String),
    Int(i64),
}

/// The dictionary's tables and what is in them.
pub struct Dictionary {
    tables: ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<i32, i32>,
    functions: HashMap<(i32, i32, i64), i32>,
    locations: HashMap<(i32, i32, i64, i32), i32>,
    attributes: HashMap<(i32, Attr), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    links: HashMap<(Vec<u8>, Vec<u8>), i32>,
}

impl Default for Dictionary {
    fn default() -> Self {
        Dictionary {
            tables: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                // Zero ids of the lengths trace ids and span ids have, as
                // the proto recommends for strict codecs.
                link_table: vec![Link {
                    trace_id: vec![0; 16],
                    span_id: vec![0; 8],
                }],
                string_table: vec![String::new()],
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::from([(String::new(), 0)]),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            attributes: HashMap::new(),
            stacks: HashMap::from([(Vec::new(), 0)]),
            links: HashMap::new(),
        }
    }
}

/// The next index of a table of `len` entries (tables stay far below
/// `i32::MAX`: a request holds a few fitted profiles).
fn next(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl Dictionary {
    /// The index of `s` in the string table.
    pub fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = next(self.tables.string_table.len());
        self.tables.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    /// The index of the attribute `key` = `value` (a string).
    pub fn attribute(&mut self, key: &str, value: &str) -> i32 {
        self.attr(key, Attr::Str(value.to_string()))
    }

    /// The index of the attribute `key` = `value` (an integer).
    pub fn int_attribute(&mut self, key: &str, value: i64) -> i32 {
        self.attr(key, Attr::Int(value))
    }

    fn attr(&mut self, key: &str, value: Attr) -> i32 {
        let key = self.string(key);
        if let Some(&i) = self.attributes.get(&(key, value.clone())) {
            return i;
        }
        let i = next(self.tables.attribute_table.len());
        self.tables.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue {
                value: Some(match &value {
                    Attr::Str(s) => Value::StringValue(s.clone()),
                    Attr::Int(n) => Value::IntValue(*n),
                }),
            }),
            unit_strindex: 0,
        });
        self.attributes.insert((key, value), i);
        i
    }

    /// The index of the location of `frame`, its function and mapping.
    pub fn location(&mut self, frame: &Frame) -> i32 {
        let mapping = self.mapping(frame.mapping);
        let name = self.string(frame.function);
        let file = self.string(frame.file);
        let function = match self.functions.get(&(name, file, frame.line)) {
            Some(&i) => i,
            None => {
                let i = next(self.tables.function_table.len());
                self.tables.function_table.push(Function {
                    name_strindex: name,
                    system_name_strindex: name,
                    filename_strindex: file,
                    start_line: frame.line,
                });
                self.functions.insert((name, file, frame.line), i);
                i
            }
        };
        let ty = self.attribute(super::FRAME_TYPE, frame.ty);
        let key = (mapping, function, frame.line, ty);
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let i = next(self.tables.location_table.len());
        self.tables.location_table.push(Location {
            mapping_index: mapping,
            address: 0,
            lines: vec![Line {
                function_index: function,
                line: frame.line,
                column: 0,
            }],
            attribute_indices: vec![ty],
        });
        self.locations.insert(key, i);
        i
    }

    fn mapping(&mut self, file: &str) -> i32 {
        let name = self.string(file);
        if let Some(&i) = self.mappings.get(&name) {
            return i;
        }
        let i = next(self.tables.mapping_table.len());
        self.tables.mapping_table.push(Mapping {
            filename_strindex: name,
            ..Mapping::default()
        });
        self.mappings.insert(name, i);
        i
    }

    /// The index of the stack of `locations`, leaf first.
    pub fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = next(self.tables.stack_table.len());
        self.tables.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    /// The index of the link to span `span_id` of trace `trace_id` (all
    /// zero when its record was not read).
    pub fn link(&mut self, trace_id: [u8; 16], span_id: [u8; 8]) -> i32 {
        let key = (trace_id.to_vec(), span_id.to_vec());
        if let Some(&i) = self.links.get(&key) {
            return i;
        }
        let i = next(self.tables.link_table.len());
        self.tables.link_table.push(Link {
            trace_id: key.0.clone(),
            span_id: key.1.clone(),
        });
        self.links.insert(key, i);
        i
    }

    /// The tables, for the request.
    pub fn finish(self) -> ProfilesDictionary {
        self.tables
    }
}
