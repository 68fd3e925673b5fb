//! Tests for `luminal_models::chat`.

use luminal_models::chat::{ChatError, ChatMessage, ChatTemplate, CHATML_TEMPLATE};

/// SmolLM2-Instruct's `chat_template`, as its tokenizer_config.json decodes (the `\n`s are
/// newline characters inside Jinja string literals).
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// What jinja2 renders for SmolLM2 on [user: "What is 2+2?"] with the generation prompt.
const SMOLLM2_EXPECTED: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn smollm2_single_user() {
    let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
    let out = t.apply(&[ChatMessage::user("What is 2+2?")], true).unwrap();
    assert_eq!(out, SMOLLM2_EXPECTED);
    // Without the generation prompt the assistant header is absent.
    let out = t
        .apply(&[ChatMessage::user("What is 2+2?")], false)
        .unwrap();
    assert_eq!(
        out,
        SMOLLM2_EXPECTED.trim_end_matches("<|im_start|>assistant\n")
    );
}

#[test]
fn smollm2_with_jinja_escapes() {
    // The same template with `\n` written as a Jinja escape renders identically.
    let escaped = SMOLLM2.replace('\n', "\\n");
    assert!(!escaped.contains('\n'));
    let t = ChatTemplate::new(&escaped, "", "").unwrap();
    let out = t.apply(&[ChatMessage::user("What is 2+2?")], true).unwrap();
    assert_eq!(out, SMOLLM2_EXPECTED);
}

#[test]
fn smollm2_keeps_user_system_prompt() {
    let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
    let out = t
        .apply(
            &[
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi"),
                ChatMessage::assistant("Hello."),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    );
}

#[test]
fn chatml_fallback() {
    let t = ChatTemplate::chatml();
    assert_eq!(t.source(), CHATML_TEMPLATE);
    assert_eq!(t.eos_token(), "<|im_end|>");
    let out = t
        .apply(&[ChatMessage::system("S"), ChatMessage::user("U")], true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(t.apply(&[], false).unwrap(), "");
    // Clone compiles the same template.
    assert_eq!(
        t.clone().apply(&[ChatMessage::user("U")], true).unwrap(),
        t.apply(&[ChatMessage::user("U")], true).unwrap()
    );
}

#[test]
fn raise_exception_is_reported() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools: ' + m.content) }}{% endif %}{{ m.content }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.apply(&[ChatMessage::user("ok")], false).unwrap(), "ok");
    match t.apply(&[ChatMessage::new("tool", "x")], false) {
        Err(ChatError::Raised(msg)) => assert_eq!(msg, "no tools: x"),
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn parse_and_render_errors() {
    assert!(matches!(
        ChatTemplate::new("{% for m in messages %}", "", ""),
        Err(ChatError::Parse(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content.no_such_method() }}", "", "").unwrap();
    let err = t.apply(&[ChatMessage::user("x")], false).unwrap_err();
    assert!(matches!(err, ChatError::Render(_)), "{err:?}");
    assert!(!err.to_string().is_empty());
}

#[test]
fn python_methods_loop_controls_and_tokens() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{% for m in messages %}{% if m.content.strip() == '' %}{% continue %}{% endif %}\
         {% if m.content.startswith('STOP') %}{% break %}{% endif %}\
         [{{ m.role.upper() }}:{{ m.content.strip() }}]{% endfor %}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let out = t
        .apply(
            &[
                ChatMessage::user("  a  "),
                ChatMessage::user("   "),
                ChatMessage::assistant("b\n"),
                ChatMessage::user("STOP here"),
                ChatMessage::user("c"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(out, "<s>[USER:a][ASSISTANT:b]</s>");
}

#[test]
fn strftime_now_renders_a_date() {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
    let out = t.apply(&[], false).unwrap();
    assert_eq!(out.len(), 10, "{out}");
    let year: i32 = out[..4].parse().unwrap();
    assert!(year >= 2024);
    assert_eq!(&out[4..5], "-");
}

#[test]
fn from_tokenizer_config() {
    let cfg = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "lstrip": false},
        "chat_template": SMOLLM2,
    });
    let t = ChatTemplate::from_tokenizer_config(&cfg.to_string())
        .unwrap()
        .unwrap();
    assert_eq!(t.bos_token(), "<|im_start|>");
    assert_eq!(t.eos_token(), "<|im_end|>");
    assert_eq!(
        t.apply(&[ChatMessage::user("What is 2+2?")], true).unwrap(),
        SMOLLM2_EXPECTED
    );
    let list = serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default:{{ messages|length }}"},
        ],
    });
    let t = ChatTemplate::from_tokenizer_config(&list.to_string())
        .unwrap()
        .unwrap();
    assert_eq!(
        t.apply(&[ChatMessage::user("x")], false).unwrap(),
        "default:1"
    );
    assert!(ChatTemplate::from_tokenizer_config("{}").unwrap().is_none());
    assert!(matches!(
        ChatTemplate::from_tokenizer_config("not json"),
        Err(ChatError::Config(_))
    ));
}

/// Renders from `scripts/gen_chat_fixtures.py` (Python jinja2 with transformers' settings).
#[test]
fn matches_jinja2_fixtures() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates.json"
    );
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run scripts/gen_chat_fixtures.py)"));
    let fx: serde_json::Value = serde_json::from_str(&text).unwrap();
    // The fixture's SmolLM2 template is the one above.
    assert_eq!(fx["templates"]["smollm2"]["template"], SMOLLM2);
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 18);
    let (mut ok, mut raised) = (0, 0);
    for case in cases {
        let tname = case["template"].as_str().unwrap();
        let cname = case["conversation"].as_str().unwrap();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let tdef = &fx["templates"][tname];
        let t = ChatTemplate::new(
            tdef["template"].as_str().unwrap(),
            tdef["bos_token"].as_str().unwrap(),
            tdef["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{tname}: {e}"));
        let msgs: Vec<ChatMessage> = fx["conversations"][cname]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let got = t.apply(&msgs, agp);
        let label = format!("{tname} / {cname} / add_generation_prompt={agp}");
        if let Some(want) = case.get("expected").and_then(|v| v.as_str()) {
            let got = got.unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(got, want, "{label}");
            ok += 1;
        } else {
            let want = case["error"].as_str().unwrap();
            match got {
                Err(ChatError::Raised(msg)) => assert_eq!(msg, want, "{label}"),
                other => panic!("{label}: expected raise_exception({want:?}), got {other:?}"),
            }
            raised += 1;
        }
    }
    assert!(ok > 0 && raised > 0);
}
