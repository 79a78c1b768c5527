//! Tests of the GBNF reader (`super`): exact Lark text, and what the compiled grammar accepts.
use super::*;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// A vocabulary of the 256 bytes (ids 0-255) and an end token (256).
struct Bytes {
    trie: TokTrie,
}

impl TokenizerEnv for Bytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }
}

fn factory() -> ParserFactory {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e', b'n', b'd']);
    let info = TokRxInfo::new(words.len() as u32, 256);
    let env: TokEnv = Arc::new(Bytes {
        trie: TokTrie::from(&info, &words),
    });
    let mut f = ParserFactory::new_simple(&env).unwrap();
    f.quiet();
    f
}

/// Reads `gbnf`, checks its Lark text is `lark`, compiles it, and checks which of `texts`
/// it accepts whole (`true`) or refuses.
fn check(gbnf: &str, lark: &str, texts: &[(&str, bool)]) {
    let got = to_lark(gbnf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, lark);
    let f = factory();
    for &(text, want) in texts {
        let p = f.create_parser(TopLevelGrammar::from_lark(got.clone()));
        let mut m = Matcher::new(p);
        assert_eq!(m.get_error(), None, "{got}");
        let toks: Vec<u32> = text.bytes().map(u32::from).collect();
        let n = m.validate_tokens(&toks).unwrap();
        let accepted = n == toks.len() && {
            m.consume_tokens(&toks).unwrap();
            m.is_accepting().unwrap()
        };
        assert_eq!(accepted, want, "{text:?} under {got}");
    }
}

fn error(gbnf: &str) -> String {
    to_lark(gbnf).unwrap_err().to_string()
}

#[test]
fn alternatives_and_literals() {
    check(
        "root ::= \"yes\" | \"no\"",
        "start: \"yes\" | \"no\"\n",
        &[
            ("yes", true),
            ("no", true),
            ("yesno", false),
            ("ye", false),
            ("", false),
        ],
    );
    // escapes: quotes, backslashes, \x \u \U, brackets, and text as it is
    check(
        r#"root ::= "\"q\" \\ \x41\u00e9\U0001F600 \[\]\n\t€""#,
        "start: \"\\\"q\\\" \\\\ Aé😀 []\\n\\t€\"\n",
        &[("\"q\" \\ Aé😀 []\n\t€", true), ("\"q\" \\ A", false)],
    );
    // a control character is written as a JSON escape
    check(
        r#"root ::= "a\x01" """#,
        "start: \"a\\u0001\" \"\"\n",
        &[("a\u{1}", true)],
    );
}

#[test]
fn lists_recursion_and_names() {
    check(
        "root ::= item (\",\" item)*\nitem ::= [a-z]+",
        "start: item (\",\" item)*\nitem: /[a-z]/+\n",
        &[
            ("a", true),
            ("ab,c,de", true),
            ("ab,", false),
            (",a", false),
            ("A", false),
        ],
    );
    // arithmetic: recursion through a group, dashed and capitalised names, comments,
    // a body over several lines
    check(
        "# sums of products\n\
         root ::= term ((\"+\" | \"-\") term)*   # a sum\n\
         term ::= Factor\n\
         \x20   (\"*\" Factor)*\n\
         Factor ::= num-lit | \"(\" root \")\"\n\
         num-lit ::= [0-9]{1,3}\n",
        "start: term ((\"+\" | \"-\") term)*\n\
         term: factor (\"*\" factor)*\n\
         factor: num_lit | \"(\" start \")\"\n\
         num_lit: /[0-9]/{1,3}\n",
        &[
            ("1+2*3", true),
            ("(1+2)*30-4", true),
            ("((7))", true),
            ("1+", false),
            ("(1", false),
            ("1234", false),
        ],
    );
    // names that would meet: case, '-', a leading digit, 'start'
    check(
        "root ::= a-b A-B ab-2 x 1x start\na-b ::= \"1\"\nA-B ::= \"2\"\nab-2 ::= \"3\"\n\
         x ::= \"4\"\n1x ::= \"5\"\nstart ::= \"6\"",
        "start: a_b a_b_2 ab_2 x r_1x start_2\na_b: \"1\"\na_b_2: \"2\"\nab_2: \"3\"\n\
         x: \"4\"\nr_1x: \"5\"\nstart_2: \"6\"\n",
        &[("123456", true), ("12345", false)],
    );
}

#[test]
fn classes_any_and_counts() {
    // `[]` matches nothing, `[^]` any character
    check(
        "root ::= \"a\" | [] \"b\" | \"c\" [^]",
        "start: \"a\" | /[^\\x{0}-\\x{10FFFF}]/ \"b\" | \"c\" /(?s:.)/\n",
        &[
            ("a", true),
            ("b", false),
            ("c\n", true),
            ("cé", true),
            ("c", false),
        ],
    );
    check(
        r#"root ::= [^a-c\n] [\]\[/^-] [é-ë] . "!""#,
        "start: /[^a-c\\x{A}]/ /[\\x{5D}\\x{5B}\\x{2F}\\x{5E}\\x{2D}]/ /[\\x{E9}-\\x{EB}]/ \
         /(?s:.)/ \"!\"\n",
        &[
            ("d]ê\n!", true),
            ("z-é€!", true),
            ("a]é.!", false),
            ("\n]é.!", false),
            ("d]ì.!", false),
            ("d]é!", false),
        ],
    );
    check(
        "root ::= \"a\"{2} \"b\"{1,} \"c\"{,2} \"d\"{0,1} \"e\"{0} (\"f\" | \"g\"){2,3}? \"h\"*",
        "start: \"a\"{2} \"b\"+ \"c\"{0,2} \"d\"? \"\" ((\"f\" | \"g\"){2,3})? \"h\"*\n",
        &[
            ("aab", true),
            ("aabbbccdfghhh", true),
            ("aabfgf", true),
            ("ab", false),
            ("aa", false),
            ("aabccc", false),
            ("aabe", false),
            ("aabf", false),
        ],
    );
}

#[test]
fn lines_and_empty_alternatives() {
    // a rule goes on over lines inside parentheses, after '|', and where the next line
    // does not start a rule; an empty alternative is the empty string
    check(
        "root ::= (\n  \"a\" |\n  \"b\"\n) tail\n  | \"c\"\n\ntail ::= | \"!\" tail\n",
        "start: (\"a\" | \"b\") tail | \"c\"\ntail: \"\" | \"!\" tail\n",
        &[("a", true), ("b!!", true), ("c", true), ("c!", false)],
    );
}

#[test]
fn overlapping_literals_are_lexed_greedily() {
    // llguidance ends a lexeme only where it cannot go on: after "ab" it follows "abc"
    // alone, so "abd" (through "a" "bd") is refused where llama.cpp takes it
    check(
        "root ::= \"abc\" | \"a\" \"bd\" | \"x\" [a-z] \"y\"",
        "start: \"abc\" | \"a\" \"bd\" | \"x\" /[a-z]/ \"y\"\n",
        &[("abc", true), ("abd", false), ("xay", true)],
    );
}

#[test]
fn errors_name_the_line_and_column() {
    assert_eq!(
        error("root ::= item\nitems ::= \"a\""),
        "line 1, column 10: rule 'item' is used but not defined"
    );
    assert_eq!(
        error("item ::= \"a\""),
        "line 1, column 1: the grammar has no rule 'root' (the rule the output matches)"
    );
    assert_eq!(
        error("root ::= \"a\"\nroot ::= \"b\""),
        "line 2, column 1: rule 'root' is defined twice (first on line 1)"
    );
    assert_eq!(
        error("root ::= \"abc"),
        "line 1, column 10: unterminated string literal"
    );
    assert_eq!(
        error("root ::= [a-z"),
        "line 1, column 10: unterminated character class"
    );
    assert_eq!(
        error("root ::= (\"a\"\n  | \"b\""),
        "line 1, column 10: unterminated group: no ')'"
    );
    assert_eq!(
        error("root ::= \"a\")"),
        "line 1, column 13: ')' without a '(' before it"
    );
    assert_eq!(
        error("root ::= \"\\q\""),
        "line 1, column 11: unknown escape '\\q' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \
         \\xHH \\uHHHH \\UHHHHHHHH)"
    );
    assert_eq!(
        error("root ::= [\\x4]"),
        "line 1, column 11: escape '\\x' needs 2 hexadecimal digits"
    );
    assert_eq!(
        error("root ::= \"\\uD800\""),
        "line 1, column 11: escape '\\uD800' is not a Unicode character"
    );
    assert_eq!(
        error("root ::= [z-a]"),
        "line 1, column 11: range 'z'-'a' ends below its start"
    );
    assert_eq!(
        error("root ::= \"a\"{3,2}"),
        "line 1, column 13: count {3,..} ends below its start"
    );
    assert_eq!(
        error("root ::= \"a\"{10001}"),
        "line 1, column 14: count 10001 is above 10000, the most a grammar may repeat"
    );
    assert_eq!(
        error("root ::= \"a\"{2"),
        "line 1, column 13: unterminated count: no '}'"
    );
    assert_eq!(
        error("root ::= \"a\" ; \"b\""),
        "line 1, column 14: unexpected ';'"
    );
    assert_eq!(
        error("root := \"a\""),
        "line 1, column 6: expected '::=' after the rule name 'root'"
    );
}

#[test]
fn gbnf_is_told_from_lark() {
    assert!(is_gbnf("root ::= \"a\""));
    assert!(is_gbnf("# c\n  list-item::= \"a\""));
    assert!(!is_gbnf("start: \"a ::= b\""));
    assert!(!is_gbnf("start: x\nx: \"::=\""));
}
