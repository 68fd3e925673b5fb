//! Chat templates: Hugging Face's Jinja `chat_template`, rendered with MiniJinja.
//!
//! The environment mirrors the one `transformers` builds in `apply_chat_template`:
//! `trim_blocks` and `lstrip_blocks` on, the `loopcontrols` extension (`{% break %}`,
//! `{% continue %}`), a `raise_exception(msg)` function that aborts rendering with
//! [`ChatError::Raised`], `strftime_now(fmt)` (UTC), and Python string/dict methods
//! (`.strip()`, `.startswith()`, `.split()`, `.items()`, …) through `minijinja-contrib`'s
//! pycompat layer. The template sees `messages` (a list of `{role, content}` maps),
//! `add_generation_prompt`, `bos_token` and `eos_token`.
//!
//! ```
//! use luminal_models::chat::{ChatMessage, ChatTemplate};
//!
//! let t = ChatTemplate::chatml();
//! let s = t.apply(&[ChatMessage::user("Hi")], true).unwrap();
//! assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, or whatever else the template understands.
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Errors from building or applying a [`ChatTemplate`].
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template source does not parse.
    #[error("invalid chat template: {0:#}")]
    Parse(#[source] minijinja::Error),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// Rendering failed (undefined method, type error, …).
    #[error("failed to render chat template: {0:#}")]
    Render(#[source] minijinja::Error),
    /// A `tokenizer_config.json` could not be read as a chat template source.
    #[error("invalid tokenizer config: {0}")]
    Config(String),
}

/// The marker error that `raise_exception` attaches as the source of its MiniJinja error,
/// so [`ChatTemplate::apply`] can report it as [`ChatError::Raised`].
#[derive(Debug)]
struct RaisedException(String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

const TEMPLATE_NAME: &str = "chat_template";

/// ChatML, the fallback for models that ship no template (no default system prompt).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A compiled chat template plus the special tokens it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        // The source compiled once already, so it compiles again.
        Self::new(&self.source, &self.bos_token, &self.eos_token)
            .expect("a chat template that compiled once compiles again")
    }
}

impl ChatTemplate {
    /// Compiles `template_src` (a Hugging Face `chat_template` string).
    pub fn new(template_src: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(ChatError::Parse)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, template_src.to_owned())
            .map_err(ChatError::Parse)?;
        Ok(Self {
            env,
            source: template_src.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The ChatML template ([`CHATML_TEMPLATE`]) with ChatML's end token
    /// (`<|im_end|>`) and no BOS: the fallback for models without a template.
    pub fn chatml() -> Self {
        Self::new(CHATML_TEMPLATE, "", "<|im_end|>").expect("the built-in ChatML template compiles")
    }

    /// Reads the template and special tokens from the text of a Hugging Face
    /// `tokenizer_config.json`. `chat_template` may be a string or a list of
    /// `{name, template}` (the one named `default`, else the first, is used); `bos_token`
    /// and `eos_token` may be strings or `{"content": …}` objects. Returns `Ok(None)` when
    /// the config has no `chat_template`.
    pub fn from_tokenizer_config(json: &str) -> Result<Option<Self>, ChatError> {
        let cfg: serde_json::Value =
            serde_json::from_str(json).map_err(|e| ChatError::Config(e.to_string()))?;
        let template = match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let named = |want: Option<&str>| {
                    list.iter().find_map(|e| {
                        let name = e.get("name").and_then(|n| n.as_str());
                        let t = e.get("template").and_then(|t| t.as_str())?;
                        match want {
                            Some(w) if name != Some(w) => None,
                            _ => Some(t.to_owned()),
                        }
                    })
                };
                named(Some("default"))
                    .or_else(|| named(None))
                    .ok_or_else(|| ChatError::Config("empty chat_template list".into()))?
            }
            Some(other) => {
                return Err(ChatError::Config(format!(
                    "chat_template must be a string or a list, got {other}"
                )))
            }
        };
        let token = |key: &str| -> String {
            match cfg.get(key) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(obj @ serde_json::Value::Object(_)) => obj
                    .get("content")
                    .and_then(|c| c.as_str())
                    .unwrap_or("")
                    .to_owned(),
                _ => String::new(),
            }
        };
        Self::new(&template, &token("bos_token"), &token("eos_token")).map(Some)
    }

    /// The template a model's tokenizer ships (its `bos_token` and `eos_token` are the
    /// texts of the tokenizer's BOS and EOS tokens), or [`ChatTemplate::chatml`] when it has
    /// none.
    pub fn for_tokenizer(tok: &luminal_io::Tokenizer) -> Result<Self, ChatError> {
        let token_text =
            |id: Option<u32>| id.and_then(|id| tok.id_to_token(id)).unwrap_or_default();
        match tok.chat_template() {
            Some(src) => Self::new(src, &token_text(tok.bos_id()), &token_text(tok.eos_id())),
            None => Ok(Self::chatml()),
        }
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS token string the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token string the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`; with `add_generation_prompt` the output ends with the header
    /// that opens the assistant's turn.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => Value::from(msgs),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(ChatError::Render)?;
        tmpl.render(ctx).map_err(|e| match raised_message(&e) {
            Some(msg) => ChatError::Raised(msg),
            None => ChatError::Render(e),
        })
    }
}

/// Finds a [`RaisedException`] in the error's source chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<RaisedException>() {
            return Some(r.0.clone());
        }
        cur = e.source();
    }
    None
}

/// `raise_exception(message)`: aborts rendering, as in `transformers`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// `strftime_now(format)`: the current UTC time formatted with C `strftime` directives
/// (`%Y %y %m %d %e %H %I %M %S %p %B %b %h %A %a %j %F %T %D %R %%`).
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime_utc(&format, secs)?))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Formats `unix_secs` (UTC) with a subset of C `strftime`.
fn strftime_utc(format: &str, unix_secs: i64) -> Result<String, Error> {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3).
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[m as usize - 1] + d + u32::from(m > 2 && is_leap(y));
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        match spec {
            'Y' => out += &y.to_string(),
            'y' => out += &format!("{:02}", y.rem_euclid(100)),
            'm' => out += &format!("{m:02}"),
            'd' => out += &format!("{d:02}"),
            'e' => out += &format!("{d:2}"),
            'H' => out += &format!("{hh:02}"),
            'I' => out += &format!("{h12:02}"),
            'M' => out += &format!("{mm:02}"),
            'S' => out += &format!("{ss:02}"),
            'p' => out += if hh < 12 { "AM" } else { "PM" },
            'B' => out += MONTHS[m as usize - 1],
            'b' | 'h' => out += &MONTHS[m as usize - 1][..3],
            'A' => out += WEEKDAYS[wd],
            'a' => out += &WEEKDAYS[wd][..3],
            'j' => out += &format!("{yday:03}"),
            'F' => out += &format!("{y}-{m:02}-{d:02}"),
            'T' => out += &format!("{hh:02}:{mm:02}:{ss:02}"),
            'R' => out += &format!("{hh:02}:{mm:02}"),
            'D' => out += &format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::strftime_utc;

    #[test]
    fn strftime_known_instants() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S", t).unwrap(),
            "2024-07-26 13:05:09"
        );
        assert_eq!(strftime_utc("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %j %I%p %%", t).unwrap(),
            "Friday July 208 01PM %"
        );
        assert_eq!(strftime_utc("%F %a", 0).unwrap(), "1970-01-01 Thu");
        assert!(strftime_utc("%Q", 0).is_err());
    }
}
