#!/usr/bin/env python3
"""Reference renders of chat templates, made with Python's jinja2 the way `transformers` does.

    pip install jinja2
    python3 scripts/gen_chat_fixtures.py   # writes crates/luminal_model_tests/tests/fixtures/chat_templates.json

The environment copies `transformers`' `_compile_jinja_template`: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension,
plus the `raise_exception` global. Templates: SmolLM2-Instruct's (verbatim), a Llama-3 style
one (bos_token, `.strip()`, `raise_exception`, `{% continue %}`, multi-line block tags), and a
Mistral style `[INST]` one (alternation check via `raise_exception`, system prompt folded into
the first user turn, eos_token after assistant turns). Each runs on every conversation with
and without the generation prompt; a case whose template raised records the message instead.
"""
import json
import os

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.globals["raise_exception"] = raise_exception

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3 = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
    {% if message['content'].strip() == '' %}
        {% continue %}
    {% endif %}
    {{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'].strip() + '<|eot_id|>' }}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{% endif %}"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""

TEMPLATES = {
    "smollm2": {"template": SMOLLM2, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "llama3": {"template": LLAMA3, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral": {"template": MISTRAL, "bos_token": "<s>", "eos_token": "</s>"},
}


def msg(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "single_user": [msg("user", "What is 2+2?")],
    "system_multi_turn": [
        msg("system", "You are terse."),
        msg("user", "  Bonjour ! Ça va ? 🙂  "),
        msg("assistant", "Oui.\nEt toi ?"),
        msg("user", "Write {{ braces }} and {% tags %} literally."),
    ],
    "no_system_multi_turn": [
        msg("user", "Hi"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "   "),
        msg("user", "Tell me a joke.\n"),
    ],
    "bad_roles": [msg("assistant", "I speak first."), msg("tool", "42")],
}

cases = []
for tname, t in TEMPLATES.items():
    tmpl = env.from_string(t["template"])
    for cname, conv in CONVERSATIONS.items():
        for agp in (True, False):
            case = {"template": tname, "conversation": cname, "add_generation_prompt": agp}
            try:
                case["expected"] = tmpl.render(
                    messages=conv,
                    add_generation_prompt=agp,
                    bos_token=t["bos_token"],
                    eos_token=t["eos_token"],
                )
            except TemplateError as e:
                case["error"] = str(e)
            cases.append(case)

out = os.path.join(os.path.dirname(__file__), "..", "crates", "luminal_models", "tests", "fixtures", "chat_templates.json")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w", encoding="utf-8") as f:
    json.dump(
        {"jinja2_version": jinja2.__version__, "templates": TEMPLATES, "conversations": CONVERSATIONS, "cases": cases},
        f,
        ensure_ascii=False,
        indent=1,
    )
    f.write("\n")
print(f"wrote {len(cases)} cases to {os.path.normpath(out)}")
