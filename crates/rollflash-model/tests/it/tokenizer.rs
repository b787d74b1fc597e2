//! Tokenizers (built-in, saved, hand-built Hugging Face files) and chat-template rendering
//! against the real templates of Qwen2.5, Qwen3 and SmolLM2.

use std::error::Error;
use std::fs;

use rollflash_model::chat::{ChatMessage, ChatTemplate};
use rollflash_model::tokenizer::Tokenizer;
use rollflash_model::ModelError;

type TestResult = Result<(), Box<dyn Error>>;

/// Every character the built-in tokenizer knows, plus special-token strings, near misses and
/// characters it does not know.
fn sample_texts() -> Vec<String> {
    let printable: String = (' '..='~').collect();
    vec![
        String::new(),
        printable,
        "Q: Tom has 12 apples and eats 5. How many are left?\nA: 7".to_string(),
        "SFFF\nFHFH\nFFFH\nHFFG".to_string(),
        "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>".to_string(),
        "<|user|>\nhi\n<|assistant|>\nok<eos>\n".to_string(),
        "<bos><pad><unk><eos><eo<<eos>>".to_string(),
        "tab\there, café, ☃ and \r\n".to_string(),
    ]
}

#[test]
fn builtin_encode_decode_round_trip() -> TestResult {
    let tok = Tokenizer::builtin();
    assert_eq!(tok.vocab_size(), 100);
    assert_eq!(
        (tok.pad_token_id(), tok.eos_token_id(), tok.bos_token_id()),
        (Some(0), Some(1), Some(2))
    );
    assert_eq!(tok.encode("Hi\n", false)?, [72 - 27, 105 - 27, 4]);
    assert_eq!(tok.encode("Hi", true)?, [2, 72 - 27, 105 - 27]);
    assert_eq!(tok.encode("a<eos>", false)?, [97 - 27, 1]);
    assert_eq!(tok.encode("é\t", false)?, [3, 3]);

    for text in sample_texts()
        .iter()
        .filter(|t| t.is_ascii() && !t.contains('\t'))
    {
        let ids = tok.encode(text, true)?;
        assert_eq!(&tok.decode(&ids[1..], false)?, text);
    }
    let ids = tok.encode("x=<eos>", true)?;
    assert_eq!(tok.decode(&ids, true)?, "x=");
    assert_eq!(tok.decode(&ids, false)?, "<bos>x=<eos>");
    // Out-of-vocabulary ids (a padded embedding) are dropped, as Hugging Face does.
    assert_eq!(tok.decode(&[38, 500, 38], false)?, "AA");
    Ok(())
}

#[test]
fn builtin_save_then_from_dir_gives_the_same_ids() -> TestResult {
    let dir = tempfile::tempdir()?;
    let builtin = Tokenizer::builtin();
    builtin.save(dir.path())?;
    let loaded = Tokenizer::from_dir(dir.path())?;

    assert_eq!(loaded.vocab_size(), builtin.vocab_size());
    assert_eq!(loaded.eos_token_id(), builtin.eos_token_id());
    assert_eq!(loaded.bos_token_id(), builtin.bos_token_id());
    assert_eq!(loaded.pad_token_id(), builtin.pad_token_id());
    for id in 0..builtin.vocab_size() as u32 + 2 {
        let token = builtin.id_to_token(id);
        assert_eq!(loaded.id_to_token(id), token, "id {id}");
        if let Some(token) = token {
            assert_eq!(loaded.token_to_id(&token), Some(id), "token {token:?}");
        }
    }
    for text in sample_texts() {
        for special in [false, true] {
            let ids = builtin.encode(&text, special)?;
            assert_eq!(loaded.encode(&text, special)?, ids, "{text:?}");
            for skip in [false, true] {
                assert_eq!(loaded.decode(&ids, skip)?, builtin.decode(&ids, skip)?);
            }
        }
    }

    // The saved config carries the built-in chat template.
    let template = ChatTemplate::from_tokenizer_config(&dir.path().join("tokenizer_config.json"))?
        .ok_or("saved config has no chat template")?;
    let messages = [ChatMessage::system("S"), ChatMessage::user("U")];
    assert_eq!(
        template.render(&messages, true)?,
        ChatTemplate::builtin()?.render(&messages, true)?
    );

    // A tokenizer loaded from a directory saves back to the same files' meaning.
    let again = tempfile::tempdir()?;
    loaded.save(again.path())?;
    let reloaded = Tokenizer::from_dir(again.path())?;
    let text = &sample_texts()[2];
    assert_eq!(reloaded.encode(text, true)?, builtin.encode(text, true)?);
    assert!(
        ChatTemplate::from_tokenizer_config(&again.path().join("tokenizer_config.json"))?.is_some()
    );
    Ok(())
}

/// A tiny byte-pair-encoding tokenizer: `hello` merges to one token, `</s>` is a special token.
const TINY_BPE: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 9, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": null,
  "post_processor": null,
  "decoder": null,
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": "<unk>",
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": false,
    "byte_fallback": false,
    "vocab": {"<unk>": 0, "h": 1, "e": 2, "l": 3, "o": 4, "he": 5, "ll": 6, "llo": 7,
              "hello": 8, "</s>": 9},
    "merges": ["h e", "l l", "ll o", "he llo"]
  }
}"#;

#[test]
fn hand_built_hf_tokenizer_loads_and_encodes() -> TestResult {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("tokenizer.json"), TINY_BPE)?;

    let tok = Tokenizer::from_file(&dir.path().join("tokenizer.json"))?;
    assert_eq!(tok.vocab_size(), 10);
    assert_eq!(tok.eos_token_id(), None);
    assert_eq!(tok.encode("hello", false)?, [8]);
    assert_eq!(tok.encode("helo", false)?, [5, 3, 4]);
    assert_eq!(tok.encode("hex</s>", false)?, [5, 0, 9]);
    assert_eq!(tok.token_to_id("llo"), Some(7));
    assert_eq!(tok.id_to_token(9).as_deref(), Some("</s>"));
    assert_eq!(tok.decode(&[8, 9], true)?, "hello");

    // transformers writes special tokens as strings or as AddedToken objects.
    fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": {"content": "</s>", "lstrip": false, "normalized": false,
            "rstrip": false, "single_word": false, "special": true},
            "bos_token": null, "pad_token": "<unk>"}"#,
    )?;
    let tok = Tokenizer::from_dir(dir.path())?;
    assert_eq!(tok.eos_token_id(), Some(9));
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.pad_token_id(), Some(0));
    Ok(())
}

#[test]
fn special_token_missing_from_vocabulary_is_an_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("tokenizer.json"), TINY_BPE)?;
    fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )?;
    let err = Tokenizer::from_dir(dir.path())
        .err()
        .ok_or("expected an error")?;
    assert!(
        matches!(err, ModelError::Tokenizer(ref m) if m.contains("<|im_end|>")),
        "{err}"
    );
    Ok(())
}

#[test]
fn missing_tokenizer_file_names_the_path() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("nope").join("tokenizer.json");
    let err = Tokenizer::from_file(&path)
        .err()
        .ok_or("expected an error")?;
    assert!(matches!(err, ModelError::MissingFile { path: ref p, .. } if p == &path));
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );

    let err = Tokenizer::from_dir(dir.path())
        .err()
        .ok_or("expected an error")?;
    let expected = dir.path().join("tokenizer.json");
    assert!(matches!(err, ModelError::MissingFile { path: ref p, .. } if p == &expected));
    Ok(())
}

#[test]
fn invalid_tokenizer_json_is_a_tokenizer_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tokenizer.json");
    fs::write(&path, r#"{"model": {"type": "Nope"}}"#)?;
    let err = Tokenizer::from_file(&path)
        .err()
        .ok_or("expected an error")?;
    assert!(
        matches!(err, ModelError::Tokenizer(ref m) if m.contains("tokenizer.json")),
        "{err}"
    );
    Ok(())
}

// --- chat templates ----------------------------------------------------------------------------

/// `chat_template` of Qwen/Qwen2.5-*-Instruct `tokenizer_config.json`, JSON string unescaped.
const QWEN25_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

/// `chat_template` of Qwen/Qwen3-* (the hybrid-thinking release), JSON string unescaped.
const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

/// `chat_template` of HuggingFaceTB/SmolLM2-*-Instruct (also in the GGUF under `models/`), JSON
/// string unescaped: its `\n` are real newlines inside the Jinja string literals.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn chatml(template: &str, eos: &str) -> Result<ChatTemplate, ModelError> {
    ChatTemplate::new(template, None, Some(eos.to_string()))
}

fn system_user() -> [ChatMessage; 2] {
    [
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("What is 2+3?"),
    ]
}

/// What transformers renders for `system_user()` with `add_generation_prompt=True` in all three.
const CHATML_SYSTEM_USER: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
<|im_start|>user\nWhat is 2+3?<|im_end|>\n\
<|im_start|>assistant\n";

#[test]
fn qwen25_template_renders_like_transformers() -> TestResult {
    let t = chatml(QWEN25_TEMPLATE, "<|im_end|>")?;
    assert_eq!(t.render(&system_user(), true)?, CHATML_SYSTEM_USER);
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], false)?,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n"
    );
    Ok(())
}

#[test]
fn qwen3_template_renders_like_transformers() -> TestResult {
    let t = chatml(QWEN3_TEMPLATE, "<|im_end|>")?;
    assert_eq!(t.render(&system_user(), true)?, CHATML_SYSTEM_USER);

    // Thinking of earlier turns is dropped; that of the last turn after the query is kept.
    let turns = [
        ChatMessage::user("Hi"),
        ChatMessage::assistant("<think>\nhmm\n</think>\n\nHello!"),
        ChatMessage::user("2+2?"),
        ChatMessage::assistant("<think>\nadd\n</think>\n\n4"),
    ];
    assert_eq!(
        t.render(&turns, false)?,
        "<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n\
         <|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
    );

    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
    assert_eq!(
        t.render_with(&[ChatMessage::user("Hi")], true, &extra)?,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    Ok(())
}

#[test]
fn smollm2_template_renders_like_transformers() -> TestResult {
    let t = chatml(SMOLLM2_TEMPLATE, "<|im_end|>")?;
    assert_eq!(t.render(&system_user(), true)?, CHATML_SYSTEM_USER);
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], true)?,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    Ok(())
}

#[test]
fn builtin_template_uses_only_builtin_characters() -> TestResult {
    let t = ChatTemplate::builtin()?;
    let text = t.render(&system_user(), true)?;
    assert_eq!(
        text,
        "<|system|>\nYou are a helpful assistant.\n<|user|>\nWhat is 2+3?\n<|assistant|>\n"
    );
    let reply = t.render(
        &[ChatMessage::user("1+1?"), ChatMessage::assistant("2")],
        false,
    )?;
    assert_eq!(reply, "<|user|>\n1+1?\n<|assistant|>\n2<eos>\n");
    let tok = Tokenizer::builtin();
    let ids = tok.encode(&reply, false)?;
    assert!(!ids.contains(&3), "unknown characters in {reply:?}");
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 1);
    Ok(())
}

#[test]
fn python_helpers_behave_like_jinja2_in_transformers() -> TestResult {
    let render = |src: &str| -> Result<String, ModelError> {
        ChatTemplate::new(src, Some("<s>".into()), None)?.render(&[], false)
    };
    assert_eq!(
        render("{{ {'a': '<x> é', 'b': [1, 2]} | tojson }}")?,
        r#"{"a": "<x> é", "b": [1, 2]}"#
    );
    assert_eq!(
        render("{{ [1, {'k': []}] | tojson(indent=2) }}")?,
        "[\n  1,\n  {\n    \"k\": []\n  }\n]"
    );
    assert_eq!(
        render("{{ 'é' | tojson(ensure_ascii=true) }}")?,
        r#""\u00e9""#
    );
    assert_eq!(
        render(
            "{{ '  a b '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b'.split(',') | join(';') }}"
        )?,
        "a b|axx|a;b"
    );
    assert_eq!(
        render("{{ 'hello world'.title() }} {{ 'Ab'.upper() }}{{ 'Ab'.lower() }}")?,
        "Hello World ABab"
    );
    assert_eq!(
        render("{{ 'a-b-c'.replace('-', '+', 1) }} {{ 'abc'.startswith(('x', 'a')) }}")?,
        "a+b-c True"
    );
    assert_eq!(render("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}{{ {'a': 1}.get('b', 2) }}")?, "a=12");
    // transformers passes `tools=None`; undefined special tokens render as nothing.
    assert_eq!(
        render("{{ tools is none }}{{ tools }}{{ bos_token }}{{ eos_token }}")?,
        "TrueNone<s>"
    );
    Ok(())
}

#[test]
fn template_errors_are_template_errors() -> TestResult {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None)
        .err()
        .ok_or("expected a syntax error")?;
    assert!(matches!(err, ModelError::Template(_)), "{err}");

    let t = ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}ok",
        None,
        None,
    )?;
    assert_eq!(t.render(&system_user(), false)?, "ok");
    let err = t
        .render(&[ChatMessage::user("Hi")], false)
        .err()
        .ok_or("expected raise_exception to fail the render")?;
    let ModelError::Template(source) = &err else {
        return Err(format!("not a template error: {err}").into());
    };
    assert!(
        source.to_string().contains("System message required"),
        "{source}"
    );
    Ok(())
}

#[test]
fn chat_template_from_tokenizer_config() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tokenizer_config.json");
    let write = |config: serde_json::Value| fs::write(&path, config.to_string());

    write(serde_json::json!({
        "bos_token": null,
        "eos_token": {"content": "<|im_end|>", "special": true},
        "chat_template": SMOLLM2_TEMPLATE,
    }))?;
    let t = ChatTemplate::from_tokenizer_config(&path)?.ok_or("no template")?;
    assert_eq!(t.render(&system_user(), true)?, CHATML_SYSTEM_USER);

    write(serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ eos_token }}{{ messages[0].content }}"},
        ],
        "eos_token": "</s>",
    }))?;
    let t = ChatTemplate::from_tokenizer_config(&path)?.ok_or("no template")?;
    assert_eq!(t.render(&[ChatMessage::user("Hi")], false)?, "</s>Hi");

    write(serde_json::json!({"eos_token": "</s>"}))?;
    assert!(ChatTemplate::from_tokenizer_config(&path)?.is_none());

    let missing = dir.path().join("none.json");
    let err = ChatTemplate::from_tokenizer_config(&missing)
        .err()
        .ok_or("expected an error")?;
    assert!(matches!(err, ModelError::MissingFile { ref path, .. } if path == &missing));
    Ok(())
}
