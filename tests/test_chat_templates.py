"""Genuine chat templates (as the Hub ships them, or close) render in the bounded sandbox exactly what
transformers renders."""

from __future__ import annotations

import textwrap

import pytest

from agilerl_core.llm.base_loading import char_tokenizer
from agilerl_core.llm.chat_template import chat_prompt, chat_text

WHERE = "tokenizer_config.json: field chat_template"

# ---- genuine templates (as the Hub ships them, or close): they render exactly what transformers renders --------
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA31 = textwrap.dedent("""\
    {{- bos_token }}
    {%- if custom_tools is defined %}
        {%- set tools = custom_tools %}
    {%- endif %}
    {%- if not tools_in_user_message is defined %}
        {%- set tools_in_user_message = true %}
    {%- endif %}
    {%- if not date_string is defined %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
    {%- if not tools is defined %}
        {%- set tools = none %}
    {%- endif %}
    {%- if messages[0]['role'] == 'system' %}
        {%- set system_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {%- set system_message = "" %}
    {%- endif %}
    {{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
    {%- if builtin_tools is defined or tools is not none %}
        {{- "Environment: ipython\\n" }}
    {%- endif %}
    {%- if builtin_tools is defined %}
        {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
    {%- endif %}
    {{- "Cutting Knowledge Date: December 2023\\n" }}
    {{- "Today Date: " + date_string + "\\n\\n" }}
    {%- if tools is not none and not tools_in_user_message %}
        {%- for t in tools %}
            {{- t | tojson(indent=4) }}
            {{- "\\n\\n" }}
        {%- endfor %}
    {%- endif %}
    {{- system_message }}
    {{- "<|eot_id|>" }}
    {%- for message in messages %}
        {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
            {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
                + message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}
    {%- endfor %}
    {%- if add_generation_prompt %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {%- endif %}
    """)
QWEN25 = textwrap.dedent("""\
    {%- if tools %}
        {{- '<|im_start|>system\\n' }}
        {%- for tool in tools %}
            {{- "\\n" }}
            {{- tool | tojson }}
        {%- endfor %}
    {%- else %}
        {%- if messages[0]['role'] == 'system' %}
            {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.'
                + '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
    {%- for message in messages %}
        {%- if (message.role == "user") or (message.role == "system" and not loop.first)
               or (message.role == "assistant" and not message.tool_calls) %}
            {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
        {%- endif %}
    {%- endfor %}
    {%- if add_generation_prompt %}
        {{- '<|im_start|>assistant\\n' }}
    {%- endif %}
    """)
MISTRAL = ("{{ bos_token }}{% for message in messages %}"
           "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
         "{% else %}{% set role = message['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
          "eos_token }}\n{% elif message['role'] == 'system' %}\n"
          "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
          "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")
# what a richer template does: namespaces, ~, filters, methods, str.format and %, a macro, a recursive loop, generation
FEATURES = textwrap.dedent("""\
    {%- set ns = namespace(n=0, text='') -%}
    {%- macro turn(role, body) -%}<{{ role|upper }}>{{ body }}</{{ role }}>{%- endmacro -%}
    {%- for m in messages -%}
      {%- set ns.n = ns.n + 1 -%}
      {%- set ns.text = ns.text ~ m.content.strip() ~ '|' -%}
      {{ turn(m.role, m['content']|replace('+', ' plus ')|trim) }}
      {%- for k, v in m.items()|sort %}[{{ loop.index }}:{{ k }}={{ v|length }}]{% endfor -%}
    {%- endfor -%}
    {{ '{}/{}'.format(ns.n, messages|length) }} {{ '%s-%03d' % ('n', ns.n) }} {{ ns.text[:-1] }}
    {%- for x in [[1, [2]], 3] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}{% endfor -%}
    {{ messages|map(attribute='role')|join(',') }}{{ (messages|first).content.split('=')|list|tojson }}
    {%- if add_generation_prompt %}{% generation %}<ASSISTANT>{% endgeneration %}{% endif -%}
    {{ eos_token ~ (bos_token if bos_token is defined else '') }}{{ strftime_now('%Y')|length }}
    """)
GENUINE = {"smollm2": SMOLLM2, "llama3.1": LLAMA31, "qwen2.5": QWEN25, "mistral": MISTRAL, "gemma": GEMMA,
           "zephyr": ZEPHYR, "features": FEATURES}
TEXTS = ["1+2=", "  spaced  \n text ", "", "<|im_end|> {{ 'x' * 9 }} %s {0}"]


@pytest.mark.parametrize("name", sorted(GENUINE))
def test_genuine_templates_render_exactly_what_transformers_renders(name):
    import string

    tok = char_tokenizer(string.printable)
    tok.chat_template = GENUINE[name]
    for text in TEXTS:
        want = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=False)
        assert chat_text(tok, text, WHERE) == want
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        assert chat_prompt(tok, text, WHERE) == list(ids)
