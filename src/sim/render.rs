//! The text the simulated model sees for a body of each API, like a chat template would render
//! it: every turn as `role: content\n`, then the generation prompt `assistant:`, so a later turn
//! that repeats the answer extends the cached text. Completion-style bodies are their `prompt`.
//! Also what the count endpoints count. Pure.

use serde_json::Value;

use super::generate::Kind;

/// The rendered prompt, or the 400 message llama-server would give.
pub(super) fn render(kind: Kind, body: &Value) -> Result<Vec<u8>, &'static str> {
    let turns = match kind {
        Kind::Completions | Kind::Native => return prompt(body),
        Kind::Chat => chat(body)?,
        Kind::Messages => messages(body)?,
        Kind::Responses => responses(body)?,
    };
    let mut out = String::new();
    for (role, content) in turns {
        // Trimmed like most chat templates do; the generated text starts with a space.
        out.push_str(&format!("{role}: {}\n", text(content)?.trim_start()));
    }
    out.push_str("assistant:");
    Ok(out.into_bytes())
}

fn prompt(body: &Value) -> Result<Vec<u8>, &'static str> {
    match body.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone().into_bytes()),
        Some(Value::Array(a)) => Ok(a
            .iter()
            .map(|p| match p {
                Value::String(s) => s.clone(),
                other => format!("{other} "),
            })
            .collect::<String>()
            .into_bytes()),
        _ => Err("\"prompt\" must be a string or an array"),
    }
}

fn role(m: &Value) -> Result<&str, &'static str> {
    m.get("role")
        .and_then(Value::as_str)
        .ok_or("message without a role")
}

fn chat(body: &Value) -> Result<Vec<(&str, &Value)>, &'static str> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err("'messages' is required and must be an array");
    };
    messages
        .iter()
        .map(|m| Ok((role(m)?, m.get("content").unwrap_or(&Value::Null))))
        .collect()
}

fn messages(body: &Value) -> Result<Vec<(&str, &Value)>, &'static str> {
    let mut turns = Vec::new();
    if let Some(system) = body.get("system") {
        turns.push(("system", system));
    }
    turns.extend(chat(body)?);
    Ok(turns)
}

fn responses(body: &Value) -> Result<Vec<(&str, &Value)>, &'static str> {
    let mut turns = Vec::new();
    if let Some(instructions) = body.get("instructions") {
        turns.push(("system", instructions));
    }
    match body.get("input") {
        Some(s @ Value::String(_)) => turns.push(("user", s)),
        Some(Value::Array(items)) => {
            for item in items {
                turns.push((role(item)?, item.get("content").unwrap_or(&Value::Null)));
            }
        }
        _ => return Err("'input' is required"),
    }
    Ok(turns)
}

/// A content's text: a string, or the `text` of each block.
fn text(content: &Value) -> Result<String, &'static str> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()),
        Value::Null => Ok(String::new()),
        _ => Err("message content must be a string or an array of parts"),
    }
}
