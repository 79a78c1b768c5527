//! llama-server's GBNF grammars, read into llguidance's Lark dialect ([`to_lark`]), which then
//! does the constrained decoding as for any Lark `grammar`.
//!
//! The format is llama.cpp's, as its `grammars/README.md` ("GBNF Guide") defines it:
//!
//! - a grammar is rules `name ::= body`, the output matches the rule `root`; rule names are
//!   letters, digits and `-`;
//! - a body is alternatives separated by `|`, each a sequence of items: a string literal
//!   `"..."`, a character class `[...]` (ranges `a-z`, negated `[^...]`), `.` (any
//!   character), a rule name, a group `( ... )`; an item may be followed by `*`, `+`, `?`,
//!   `{m}`, `{m,}`, `{m,n}` or `{,n}` (several apply in turn: `"a"{2}*`);
//! - literals and classes take the escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`;
//! - `#` comments to the end of the line; a rule's body goes on over line breaks inside
//!   parentheses, and (leniently) wherever the next line does not start a new rule
//!   `name ::=`; an empty alternative matches the empty string.
//!
//! The translation: each rule becomes a Lark rule `name: ...` on one line, `root` becoming
//! `start`; names are lowercased and `-` becomes `_` (Lark rule names are lowercase, and a
//! name that does not start with a letter gets `r_` in front), with `_2`, `_3`, ... added
//! where two names would meet. Literals become Lark (JSON-escaped) strings, classes and `.`
//! single-character regexes (`/[a-z]/`, `/(?s:.)/`, which matches a newline too; `[]`
//! matches nothing, `[^]` any character). Refused
//! with the line and column: an undefined rule, no `root`, a rule defined twice, an
//! unterminated literal, class or group, an unknown escape, a reversed range, a count above
//! [`MAX_COUNT`].
//!
//! One difference remains: llama.cpp matches character by character, llguidance splits the
//! text into lexemes (here the literals and classes) and ends one only where it cannot go
//! on, so where one literal is a prefix of another that could come at the same place
//! (`"abc" | "a" "bd"`), a text needing the shorter one (`abd`) is refused.

use std::collections::HashMap;
use std::fmt;

/// The largest repetition count a grammar may write (`x{m,n}`): llguidance expands counted
/// repetitions, so a count bounds the compiled grammar's size.
pub const MAX_COUNT: u32 = 10_000;

/// A grammar that is not GBNF llama.cpp would read: what is wrong, and where (1-based line,
/// column in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GbnfError {
    /// The line of the fault, from 1.
    pub line: usize,
    /// The column of the fault in characters, from 1.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GbnfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for GbnfError {}

/// Whether `g` is GBNF: it has a line that starts (after blanks) with a rule name and `::=`.
/// Otherwise it is read as llguidance's Lark, whose rules are written `name: ...`.
pub fn is_gbnf(g: &str) -> bool {
    g.lines().any(|l| {
        let l = l.trim_start();
        let name = l
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(l.len());
        name > 0 && l[name..].trim_start().starts_with("::=")
    })
}

/// The Lark text of GBNF grammar `src`: one line `name: ...` per rule, `start` (from `root`)
/// first, then the others in the order they are defined.
///
/// Errors: see the module's list; each names the line and column.
pub fn to_lark(src: &str) -> Result<String, GbnfError> {
    let mut r = Reader {
        s: src.chars().collect(),
        pos: 0,
        rules: Vec::new(),
        refs: Vec::new(),
    };
    r.grammar()?;
    // names in order of first appearance, root first
    let mut order: Vec<&str> = vec!["root"];
    for n in r
        .rules
        .iter()
        .map(|x| x.name.as_str())
        .chain(r.refs.iter().map(|x| x.0.as_str()))
    {
        if !order.contains(&n) {
            order.push(n);
        }
    }
    let names = lark_names(&order);
    let mut defined: HashMap<&str, usize> = HashMap::new();
    for rule in &r.rules {
        if let Some(&first) = defined.get(rule.name.as_str()) {
            return Err(r.error_at(
                rule.at,
                format!(
                    "rule '{}' is defined twice (first on line {})",
                    rule.name,
                    r.line_col(first).0
                ),
            ));
        }
        defined.insert(&rule.name, rule.at);
    }
    for (name, at) in &r.refs {
        if !defined.contains_key(name.as_str()) {
            return Err(r.error_at(*at, format!("rule '{name}' is used but not defined")));
        }
    }
    if !defined.contains_key("root") {
        return Err(r.error_at(
            0,
            "the grammar has no rule 'root' (the rule the output matches)".into(),
        ));
    }
    let mut rules: Vec<&Rule> = r.rules.iter().collect();
    rules.sort_by_key(|x| x.name != "root");
    let mut out = String::new();
    for rule in rules {
        out.push_str(&names[rule.name.as_str()]);
        out.push_str(": ");
        alternatives(&mut out, &rule.body, &names);
        out.push('\n');
    }
    Ok(out)
}

/// Lark rule names for GBNF names (in order of first appearance, `root` first): `root` is
/// `start`; others lowercased, `-` as `_`, `r_` before one that does not start with a
/// letter, `_2`, `_3`, ... after one already taken.
fn lark_names<'a>(order: &[&'a str]) -> HashMap<&'a str, String> {
    let mut taken: Vec<String> = Vec::new();
    let mut out = HashMap::new();
    for &n in order {
        let base = if n == "root" {
            "start".to_string()
        } else {
            let b: String = n
                .chars()
                .map(|c| match c.to_ascii_lowercase() {
                    c @ ('a'..='z' | '0'..='9') => c,
                    _ => '_',
                })
                .collect();
            if b.starts_with(|c: char| c.is_ascii_lowercase()) {
                b
            } else {
                format!("r_{b}")
            }
        };
        let mut name = base.clone();
        let mut k = 2;
        while taken.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        taken.push(name.clone());
        out.insert(n, name);
    }
    out
}

/// One rule: its GBNF name, body, and where its name starts (a char index).
struct Rule {
    name: String,
    body: Vec<Vec<Item>>,
    at: usize,
}

/// An item of a sequence.
#[derive(Debug)]
enum Item {
    /// A string literal's text.
    Literal(String),
    /// A character class: negated, inclusive ranges.
    Class(bool, Vec<(char, char)>),
    /// `.`
    Any,
    /// A rule name.
    Ref(String),
    /// `( ... )`
    Group(Vec<Vec<Item>>),
    /// An item repeated min to max (None: unbounded) times.
    Repeat(Box<Item>, u32, Option<u32>),
}

fn alternatives(out: &mut String, alts: &[Vec<Item>], names: &HashMap<&str, String>) {
    for (i, seq) in alts.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        if seq.is_empty() {
            out.push_str("\"\"");
        }
        for (j, item) in seq.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            self::item(out, item, names);
        }
    }
}

fn item(out: &mut String, it: &Item, names: &HashMap<&str, String>) {
    match it {
        Item::Literal(s) => literal(out, s),
        Item::Class(true, ranges) if ranges.is_empty() => out.push_str("/(?s:.)/"),
        Item::Class(false, ranges) if ranges.is_empty() => out.push_str("/[^\\x{0}-\\x{10FFFF}]/"),
        Item::Class(neg, ranges) => {
            out.push_str(if *neg { "/[^" } else { "/[" });
            for &(a, b) in ranges {
                class_char(out, a);
                if b != a {
                    out.push('-');
                    class_char(out, b);
                }
            }
            out.push_str("]/");
        }
        Item::Any => out.push_str("/(?s:.)/"),
        Item::Ref(n) => out.push_str(&names[n.as_str()]),
        Item::Group(alts) => {
            out.push('(');
            alternatives(out, alts, names);
            out.push(')');
        }
        Item::Repeat(inner, min, max) => {
            if *max == Some(0) {
                // `{0}`: the empty string (Lark refuses a range ending at 0)
                out.push_str("\"\"");
                return;
            }
            if matches!(**inner, Item::Repeat(..)) {
                out.push('(');
                item(out, inner, names);
                out.push(')');
            } else {
                item(out, inner, names);
            }
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => out.push_str(&format!("{{{m},}}")),
                (m, Some(n)) if m == n => out.push_str(&format!("{{{m}}}")),
                (m, Some(n)) => out.push_str(&format!("{{{m},{n}}}")),
            }
        }
    }
}

/// A Lark string literal (JSON's escapes): `"` and `\` escaped, control characters as
/// `\n`, `\r`, `\t` or `\u00XX`, everything else as itself.
fn literal(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A character inside a regex class: ASCII letters and digits as themselves, anything else
/// as `\x{H}` (no character is special then, `/` included, which would end the Lark regex).
fn class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        out.push_str(&format!("\\x{{{:X}}}", c as u32));
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// The reader: the source as characters and a position in it.
struct Reader {
    s: Vec<char>,
    pos: usize,
    rules: Vec<Rule>,
    /// Rule references with where they are, to check they are defined.
    refs: Vec<(String, usize)>,
}

impl Reader {
    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn line_col(&self, at: usize) -> (usize, usize) {
        let mut line = 1;
        let mut col = 1;
        for &c in &self.s[..at.min(self.s.len())] {
            if c == '\n' {
                line += 1;
                col = 1;
            } else {
                col += 1;
            }
        }
        (line, col)
    }

    fn error_at(&self, at: usize, message: String) -> GbnfError {
        let (line, column) = self.line_col(at);
        GbnfError {
            line,
            column,
            message,
        }
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, GbnfError> {
        Err(self.error_at(self.pos, message.into()))
    }

    /// Skips blanks and comments on the line from `p`; returns where they end.
    fn skip_inline(&self, mut p: usize) -> usize {
        while let Some(&c) = self.s.get(p) {
            match c {
                ' ' | '\t' | '\r' => p += 1,
                '#' => {
                    while self.s.get(p).is_some_and(|&c| c != '\n') {
                        p += 1;
                    }
                }
                _ => break,
            }
        }
        p
    }

    /// Skips blanks, comments and line breaks from `p`.
    fn skip_all(&self, mut p: usize) -> usize {
        loop {
            p = self.skip_inline(p);
            if self.s.get(p) == Some(&'\n') {
                p += 1;
            } else {
                return p;
            }
        }
    }

    /// Whether a rule `name ::=` starts at `p`.
    fn rule_starts(&self, p: usize) -> bool {
        let mut q = p;
        while self.s.get(q).is_some_and(|&c| is_name_char(c)) {
            q += 1;
        }
        if q == p {
            return false;
        }
        while matches!(self.s.get(q), Some(' ' | '\t')) {
            q += 1;
        }
        self.s[q.min(self.s.len())..].starts_with(&[':', ':', '='])
    }

    /// Moves over blanks and comments, and over line breaks when `nested` in a group or
    /// when what follows them is not a new rule (nor the end).
    fn gap(&mut self, nested: bool) {
        self.pos = self.skip_inline(self.pos);
        if self.peek() == Some('\n') {
            let next = self.skip_all(self.pos);
            if nested || (next < self.s.len() && !self.rule_starts(next)) {
                self.pos = next;
            }
        }
    }

    fn grammar(&mut self) -> Result<(), GbnfError> {
        loop {
            self.pos = self.skip_all(self.pos);
            if self.pos >= self.s.len() {
                return Ok(());
            }
            let at = self.pos;
            let name = self.name()?;
            while matches!(self.peek(), Some(' ' | '\t')) {
                self.pos += 1;
            }
            if !self.s[self.pos..].starts_with(&[':', ':', '=']) {
                return self.err(format!("expected '::=' after the rule name '{name}'"));
            }
            self.pos += 3;
            self.gap(false);
            let body = self.alternatives(false)?;
            self.pos = self.skip_inline(self.pos);
            match self.peek() {
                None | Some('\n') => {}
                Some(')') => return self.err("')' without a '(' before it"),
                Some(c) => return self.err(format!("unexpected {c:?} in the rule '{name}'")),
            }
            self.rules.push(Rule { name, body, at });
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return match self.peek() {
                Some(c) => self.err(format!(
                    "expected a rule name (letters, digits, '-'), found {c:?}"
                )),
                None => self.err("expected a rule name, found the end"),
            };
        }
        Ok(self.s[start..self.pos].iter().collect())
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Item>>, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.gap(nested);
            if self.peek() != Some('|') {
                return Ok(alts);
            }
            self.pos += 1;
            self.gap(nested);
            alts.push(self.sequence(nested)?);
        }
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>, GbnfError> {
        let mut seq = Vec::new();
        loop {
            self.gap(nested);
            let at = self.pos;
            let mut it = match self.peek() {
                None | Some('|' | ')' | '\n') => return Ok(seq),
                Some('"') => {
                    self.pos += 1;
                    let mut text = String::new();
                    loop {
                        match self.peek() {
                            None => {
                                return Err(self.error_at(at, "unterminated string literal".into()))
                            }
                            Some('"') => break,
                            Some(_) => text.push(self.char()?),
                        }
                    }
                    self.pos += 1;
                    Item::Literal(text)
                }
                Some('[') => self.class(at)?,
                Some('.') => {
                    self.pos += 1;
                    Item::Any
                }
                Some('(') => {
                    self.pos += 1;
                    let alts = self.alternatives(true)?;
                    self.gap(true);
                    if self.peek() != Some(')') {
                        return Err(self.error_at(at, "unterminated group: no ')'".into()));
                    }
                    self.pos += 1;
                    Item::Group(alts)
                }
                Some(c) if is_name_char(c) => {
                    let name = self.name()?;
                    self.refs.push((name.clone(), at));
                    Item::Ref(name)
                }
                Some(c) => return self.err(format!("unexpected {c:?}")),
            };
            loop {
                self.pos = self.skip_inline(self.pos);
                let (min, max) = match self.peek() {
                    Some('*') => (0, None),
                    Some('+') => (1, None),
                    Some('?') => (0, Some(1)),
                    Some('{') => self.count()?,
                    _ => break,
                };
                // past the operator, or the count's `}`
                self.pos += 1;
                it = Item::Repeat(Box::new(it), min, max);
            }
            seq.push(it);
        }
    }

    /// `{m}`, `{m,}`, `{m,n}`, `{,n}`, from its `{`; leaves the position at the `}`.
    fn count(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let open = self.pos;
        self.pos += 1;
        let blanks = |r: &mut Self| {
            while matches!(r.peek(), Some(' ' | '\t')) {
                r.pos += 1;
            }
        };
        blanks(self);
        let min = self.number()?;
        blanks(self);
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            blanks(self);
            self.number()?
        } else if min.is_none() {
            return self.err("expected a count in '{...}'");
        } else {
            min
        };
        blanks(self);
        if self.peek() != Some('}') {
            return Err(self.error_at(open, "unterminated count: no '}'".into()));
        }
        let min = min.unwrap_or(0);
        if max.is_some_and(|m| m < min) {
            return Err(self.error_at(open, format!("count {{{min},..}} ends below its start")));
        }
        Ok((min, max))
    }

    fn number(&mut self) -> Result<Option<u32>, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        let text: String = self.s[start..self.pos].iter().collect();
        match text.parse::<u32>() {
            Ok(n) if n <= MAX_COUNT => Ok(Some(n)),
            _ => Err(self.error_at(
                start,
                format!("count {text} is above {MAX_COUNT}, the most a grammar may repeat"),
            )),
        }
    }

    /// A character class from its `[`.
    fn class(&mut self, at: usize) -> Result<Item, GbnfError> {
        self.pos += 1;
        let neg = self.peek() == Some('^');
        if neg {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(at, "unterminated character class".into())),
                Some(']') => break,
                Some(_) => {}
            }
            let from_at = self.pos;
            let a = self.char()?;
            let b = if self.peek() == Some('-')
                && self.s.get(self.pos + 1).is_some_and(|&c| c != ']')
            {
                self.pos += 1;
                let b = self.char()?;
                if b < a {
                    return Err(
                        self.error_at(from_at, format!("range {a:?}-{b:?} ends below its start"))
                    );
                }
                b
            } else {
                a
            };
            ranges.push((a, b));
        }
        self.pos += 1;
        Ok(Item::Class(neg, ranges))
    }

    /// One character of a literal or class, an escape read.
    fn char(&mut self) -> Result<char, GbnfError> {
        let at = self.pos;
        let Some(c) = self.peek() else {
            return self.err("expected a character, found the end");
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return self.err("'\\' at the end");
        };
        self.pos += 1;
        let digits = match e {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            '\\' | '"' | '[' | ']' => return Ok(e),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => {
                return Err(self.error_at(
                    at,
                    format!(
                        "unknown escape '\\{e}' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \
                         \\uHHHH \\UHHHHHHHH)"
                    ),
                ))
            }
        };
        let hex: String = self.s[self.pos..(self.pos + digits).min(self.s.len())]
            .iter()
            .collect();
        if hex.len() != digits || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(self.error_at(
                at,
                format!("escape '\\{e}' needs {digits} hexadecimal digits"),
            ));
        }
        self.pos += digits;
        let v = u32::from_str_radix(&hex, 16).unwrap_or(u32::MAX);
        char::from_u32(v).ok_or_else(|| {
            self.error_at(
                at,
                format!("escape '\\{e}{hex}' is not a Unicode character"),
            )
        })
    }
}

#[cfg(test)]
#[path = "gbnf_tests.rs"]
mod tests;
