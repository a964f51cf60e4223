//! PTX text to tokens: words (identifiers, opcodes with their modifiers, registers,
//! numbers), strings and punctuation, each with its line. Comments are dropped.

use super::PtxError;

/// What a token is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// An identifier, directive, opcode (`ld.global.v4.f32`), register or number.
    Word(String),
    /// A quoted string (without the quotes).
    Str(String),
    /// One punctuation character.
    Punct(char),
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) line: u32,
}

fn word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%' | '.')
}

/// Splits `text` into tokens.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, PtxError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= chars.len() {
                    return Err(syntax(text, start, "unterminated /* comment"));
                }
                if chars[i] == '*' && chars[i + 1] == '/' {
                    i += 2;
                    break;
                }
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == '"' {
            let start = line;
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None | Some('\n') => return Err(syntax(text, start, "unterminated string")),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        if let Some(&n) = chars.get(i + 1) {
                            s.push(n);
                        }
                        i += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            out.push(Token {
                tok: Tok::Str(s),
                line: start,
            });
        } else if word_char(c) {
            let mut s = String::new();
            while i < chars.len() {
                let ch = chars[i];
                if word_char(ch) {
                    s.push(ch);
                    i += 1;
                } else if ch == ':' && chars.get(i + 1) == Some(&':') {
                    s.push_str("::");
                    i += 2;
                } else {
                    break;
                }
            }
            out.push(Token {
                tok: Tok::Word(s),
                line,
            });
        } else if ",;{}[]()<>+-@!|:=".contains(c) {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        } else {
            return Err(syntax(text, line, &format!("unexpected character {c:?}")));
        }
    }
    Ok(out)
}

/// The text of 1-based line `line`, trimmed.
pub(crate) fn line_text(text: &str, line: u32) -> String {
    text.lines()
        .nth(line.saturating_sub(1) as usize)
        .unwrap_or("")
        .trim()
        .to_string()
}

fn syntax(text: &str, line: u32, message: &str) -> PtxError {
    PtxError::Syntax {
        line,
        text: line_text(text, line),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(t: &str) -> Vec<Tok> {
        lex(t).expect("lexes").into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn words_keep_dots_and_double_colons() {
        assert_eq!(
            words("ld.shared::cta.v4.f32 {%f1, %f2}, [%rd4+-16]; // x"),
            vec![
                Tok::Word("ld.shared::cta.v4.f32".into()),
                Tok::Punct('{'),
                Tok::Word("%f1".into()),
                Tok::Punct(','),
                Tok::Word("%f2".into()),
                Tok::Punct('}'),
                Tok::Punct(','),
                Tok::Punct('['),
                Tok::Word("%rd4".into()),
                Tok::Punct('+'),
                Tok::Punct('-'),
                Tok::Word("16".into()),
                Tok::Punct(']'),
                Tok::Punct(';'),
            ]
        );
    }

    #[test]
    fn labels_comments_and_lines() {
        let toks = lex("/* a\n b */ $L__BB0_3:\n\tret;").expect("lexes");
        assert_eq!(toks[0].tok, Tok::Word("$L__BB0_3".into()));
        assert_eq!(toks[0].line, 2);
        assert_eq!(toks[1].tok, Tok::Punct(':'));
        assert_eq!(toks[2].line, 3);
    }

    #[test]
    fn bad_character_is_an_error_with_its_line() {
        let e = lex("ret;\n  add # x").expect_err("rejects #");
        assert_eq!(e.line(), 2);
    }
}
