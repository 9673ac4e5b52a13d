/* chat_template: the built-in chat templates, and data.template auto; see chat_template.h. */
#include "data/chat_template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/path.h"

/* The default system messages of Qwen2.5's and Qwen2's templates. */
#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define QWEN2_SYSTEM "You are a helpful assistant."

static const char *const template_names[TPL_COUNT] = {
    "none",  "llama3",  "llama2",     "chatml",        "alpaca",
    "qwen2.5", "qwen3", "mistral", "mistral-v3", "mistral-tekken", "qwen2"};

int chat_template_parse(const char *name, chat_template *t, errbuf *err) {
    *t = TPL_NONE;
    if (!name[0] || !strcmp(name, "auto")) return 0;
    for (int i = 1; i < TPL_COUNT; i++)
        if (!strcmp(name, template_names[i])) {
            *t = (chat_template)i;
            return 0;
        }
    return errf(err, "data.template: '%s' is not one of " CHAT_TEMPLATE_NAMES ", auto", name);
}

const char *chat_template_name(chat_template t) {
    return t >= 0 && t < TPL_COUNT ? template_names[t] : "unknown";
}

/* The [INST] templates: Llama 2's by its <<SYS>> block; Mistral v0.1/v0.2's puts a space
 * before [INST], v0.3's only after it and none before [/INST], Nemo's (tekken) none at all;
 * the first v0.1 template ('[INST] ' + content + ' [/INST]', then content + eos) is not
 * built. */
static chat_template inst_template(const char *jinja) {
    if (strstr(jinja, "<<SYS>>")) return TPL_LLAMA2;
    if (strstr(jinja, " [INST] ")) return TPL_MISTRAL;
    if (strstr(jinja, " [/INST]")) return TPL_NONE;
    return strstr(jinja, "[INST] ") ? TPL_MISTRAL_V3 : TPL_MISTRAL_TEKKEN;
}

/* Each built-in template by the strings its Jinja form always holds. */
chat_template chat_template_recognise(const char *jinja) {
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>")) return TPL_LLAMA3;
    if (strstr(jinja, "[INST]") && strstr(jinja, "[/INST]")) return inst_template(jinja);
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "<|im_end|>")) {
        if (strstr(jinja, "<think>") && strstr(jinja, "</think>")) return TPL_QWEN3;
        if (strstr(jinja, QWEN25_SYSTEM)) return TPL_QWEN25;
        if (strstr(jinja, QWEN2_SYSTEM "<|im_end|>")) return TPL_QWEN2;
        return TPL_CHATML;
    }
    if (strstr(jinja, "### Instruction:") && strstr(jinja, "### Response:")) return TPL_ALPACA;
    return TPL_NONE;
}

/* The Jinja of each template (chat_template_jinja): what transformers' apply_chat_template
 * renders into the text whose tokens are the ones chat_render's segments give (Jinja string
 * literals: \n inside them is Jinja's escape, not a newline).  llama2 is the Llama-2-chat
 * template as Meta ships it; llama3 and chatml the models' templates without a system prompt
 * of their own; alpaca fsdp_qlora's prompt without an input. */
static const char jinja_llama3[] =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] +"
    " '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endi"
    "f %}";
static const char jinja_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set sys"
    "tem_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% se"
    "t system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['"
    "role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles mus"
    "t alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
    "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\"
    "n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% "
    "if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }"
    "}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";
static const char jinja_chatml[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['conte"
    "nt'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>a"
    "ssistant\\n' }}{% endif %}";
static const char jinja_alpaca[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'Below "
    "is an instruction that describes a task. Write a response that appropriately completes t"
    "he request.\\n\\n### Instruction:\\n' + message['content'] + '\\n\\n### Response:' }}{% elif "
    "message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfo"
    "r %}";

const char *chat_template_jinja(chat_template t) {
    switch (t) {
    case TPL_LLAMA3: return jinja_llama3;
    case TPL_LLAMA2: return jinja_llama2;
    case TPL_CHATML: return jinja_chatml;
    case TPL_ALPACA: return jinja_alpaca;
    default: return NULL;
    }
}

/* chat_template is a string, or a list of {name, template} (the "default" one counts). */
static const char *config_template(json_t *cfg) {
    json_t *v = json_object_get(cfg, "chat_template");
    if (json_is_string(v)) return json_string_value(v);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default")) return json_string_value(json_object_get(e, "template"));
    }
    return NULL;
}

int chat_template_from_model(const char *model_dir, chat_template *t, errbuf *err) {
    char path[4096];
    char *text = NULL;
    size_t len;
    *t = TPL_NONE;
    if (path_join(path, sizeof path, model_dir, "tokenizer_config.json", err)) return -1;
    errbuf ignored;
    if (file_read_all(path, 64u << 20, &text, &len, &ignored))
        return errf(err, "data.template: auto needs %s's chat_template (%s); set data.template to "
                         "one of " CHAT_TEMPLATE_NAMES, path, ignored.msg);
    json_t *cfg = tokenizer_config_parse(text, len, path, err);
    free(text);
    if (!cfg) return errprefix(err, "data.template: auto");
    const char *jinja = config_template(cfg);
    *t = jinja ? chat_template_recognise(jinja) : TPL_NONE;
    json_decref(cfg);
    if (*t == TPL_NONE)
        return errf(err, "data.template: auto found %s in %s; set data.template to one of "
                         CHAT_TEMPLATE_NAMES,
                    jinja ? "a chat_template it does not recognise" : "no chat_template", path);
    return 0;
}

static int need(int32_t *slot, const tokenizer *tk, const char *name, chat_template t, errbuf *err) {
    *slot = tokenizer_token_id(tk, name, strlen(name));
    if (*slot < 0)
        return errf(err, "data.template %s: the tokenizer has no %s token", chat_template_name(t), name);
    return 0;
}

static int need_id(int32_t id, const char *what, chat_template t, errbuf *err) {
    if (id >= 0) return 0;
    return errf(err, "data.template %s: the tokenizer has no %s token (tokenizer_config.json's %s_token)",
                chat_template_name(t), what, what);
}

int tpl_tokens_find(chat_template t, const tokenizer *tk, tpl_tokens *out, errbuf *err) {
    memset(out, 0xff, sizeof *out); /* every id -1 */
    out->bos = tokenizer_bos_id(tk);
    out->eos = tokenizer_eos_id(tk);
    out->prefix = tokenizer_prefix_ids(tk, &out->n_prefix);
    switch (t) {
    case TPL_LLAMA3:
        return need_id(out->bos, "bos", t, err) || need(&out->start_header, tk, "<|start_header_id|>", t, err) ||
               need(&out->end_header, tk, "<|end_header_id|>", t, err) || need(&out->eot, tk, "<|eot_id|>", t, err);
    case TPL_LLAMA2: return need_id(out->bos, "bos", t, err) || need_id(out->eos, "eos", t, err);
    case TPL_MISTRAL:
        if (tokenizer_token_id(tk, "[INST]", 6) >= 0)
            return errf(err, "data.template mistral: the tokenizer has an [INST] token (Mistral v0.3 "
                             "and later): use mistral-v3");
        return need_id(out->bos, "bos", t, err) || need_id(out->eos, "eos", t, err);
    case TPL_MISTRAL_V3:
    case TPL_MISTRAL_TEKKEN:
        return need_id(out->bos, "bos", t, err) || need_id(out->eos, "eos", t, err) ||
               need(&out->inst, tk, "[INST]", t, err) || need(&out->inst_end, tk, "[/INST]", t, err);
    case TPL_CHATML:
    case TPL_QWEN25:
    case TPL_QWEN2:
    case TPL_QWEN3:
        return need(&out->im_start, tk, "<|im_start|>", t, err) || need(&out->im_end, tk, "<|im_end|>", t, err);
    case TPL_ALPACA:
    case TPL_NONE: return need_id(out->eos, "eos", t, err);
    case TPL_COUNT: break;
    }
    return errf(err, "data.template: unknown template %d", (int)t);
}

void tpl_segs_free(tpl_segs *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int push_seg(tpl_segs *s, tpl_seg g) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        tpl_seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = g;
    return 0;
}

int tpl_text(tpl_segs *s, const char *text, size_t len, bool loss) {
    if (!len) return 0;
    return push_seg(s, (tpl_seg){text, len, -1, loss});
}

int tpl_control(tpl_segs *s, int32_t id, bool loss) { return push_seg(s, (tpl_seg){NULL, 0, id, loss}); }

#define LIT(s, str, loss) tpl_text(s, str, sizeof str - 1, loss)

/* Python's str.isspace() for one code point. */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The code point of the UTF-8 sequence at s (k bytes: 1..4); the data is valid UTF-8 (JSON
 * strings are), so no checks beyond the length. */
static uint32_t cp_at(const unsigned char *s, size_t k) {
    if (k == 1) return s[0];
    uint32_t c = s[0] & (0x7f >> k);
    for (size_t i = 1; i < k; i++) c = c << 6 | (s[i] & 0x3f);
    return c;
}

static size_t seq_len_at(unsigned char b) { return b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2; }

text_field py_strip(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = len;
    while (a < b) {
        size_t k = seq_len_at(u[a]);
        if (a + k > b || !py_space(cp_at(u + a, k))) break;
        a += k;
    }
    while (b > a) {
        size_t k = 1;
        while (k < 4 && b - k > a && (u[b - k] & 0xc0) == 0x80) k++;
        if (!py_space(cp_at(u + b - k, k))) break;
        b -= k;
    }
    return (text_field){s + a, b - a};
}

static const char *const role_names[] = {"system", "user", "assistant"};

static int render_llama3(const tpl_tokens *tok, const chat_msg *m, size_t n, tpl_segs *out) {
    if (tpl_control(out, tok->bos, false)) return -1;
    for (size_t i = 0; i < n; i++) {
        bool loss = m[i].role == ROLE_ASSISTANT;
        text_field c = py_strip(m[i].text, m[i].len);
        const char *role = role_names[m[i].role];
        if (tpl_control(out, tok->start_header, false) || tpl_text(out, role, strlen(role), false) ||
            tpl_control(out, tok->end_header, false) || LIT(out, "\n\n", false) ||
            tpl_text(out, c.s, c.len, loss) || tpl_control(out, tok->eot, loss))
            return -1;
    }
    return 0;
}

/* The first user turn with the system prompt: STRIP("<<SYS>>\n" S "\n<</SYS>>\n\n" U), which
 * only strips U's end (or, U being all space, the block's trailing newlines). */
static int llama2_system_turn(text_field sys, text_field user, tpl_segs *out) {
    text_field u = py_strip(user.s, user.len);
    size_t kept = (size_t)(u.s - user.s) + u.len; /* U's leading space is inside the string */
    if (LIT(out, "<<SYS>>\n", false) || tpl_text(out, sys.s, sys.len, false)) return -1;
    if (!u.len) return LIT(out, "\n<</SYS>>", false);
    return LIT(out, "\n<</SYS>>\n\n", false) || tpl_text(out, user.s, kept, false);
}

static int render_llama2(const tpl_tokens *tok, const chat_msg *m, size_t n, tpl_segs *out,
                         errbuf *err) {
    text_field sys = {NULL, 0};
    if (n && m[0].role == ROLE_SYSTEM) {
        sys = (text_field){m[0].text, m[0].len};
        m++, n--;
    }
    for (size_t i = 0; i < n; i++) {
        chat_role want = i % 2 ? ROLE_ASSISTANT : ROLE_USER;
        if (m[i].role != want)
            return errf(err, "template llama2: turn %zu is %s where %s comes (roles alternate "
                             "user/assistant after an optional first system message)",
                        i + (sys.s != NULL), role_names[m[i].role], role_names[want]);
        text_field c = py_strip(m[i].text, m[i].len);
        int rc;
        if (want == ROLE_USER) {
            rc = tpl_control(out, tok->bos, false) || LIT(out, "[INST] ", false) ||
                 (i == 0 && sys.s ? llama2_system_turn(sys, (text_field){m[i].text, m[i].len}, out)
                                  : tpl_text(out, c.s, c.len, false)) ||
                 LIT(out, " [/INST]", false);
        } else {
            rc = LIT(out, " ", true) || tpl_text(out, c.s, c.len, true) || LIT(out, " ", true) ||
                 tpl_control(out, tok->eos, true);
        }
        if (rc) return errf(err, "out of memory");
    }
    return 0;
}

/* <|im_start|>ROLE\n, then the turn's text (head: no loss; body: an assistant's loss). */
static int chatml_turn(const tpl_tokens *tok, chat_role r, text_field head, text_field body,
                       tpl_segs *out) {
    bool loss = r == ROLE_ASSISTANT;
    const char *role = role_names[r];
    return tpl_control(out, tok->im_start, false) || tpl_text(out, role, strlen(role), false) ||
           LIT(out, "\n", false) || tpl_text(out, head.s, head.len, loss) ||
           tpl_text(out, body.s, body.len, loss) || tpl_control(out, tok->im_end, loss) ||
           LIT(out, "\n", false);
}

/* ChatML, with the default system message first (when not NULL) where the conversation has
 * none. */
static int render_chatml(const tpl_tokens *tok, const chat_msg *m, size_t n, const char *default_system,
                         tpl_segs *out) {
    static const text_field none = {"", 0};
    if (default_system && (!n || m[0].role != ROLE_SYSTEM) &&
        chatml_turn(tok, ROLE_SYSTEM, none, (text_field){default_system, strlen(default_system)}, out))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (chatml_turn(tok, m[i].role, none, (text_field){m[i].text, m[i].len}, out)) return -1;
    return 0;
}

/* s without the newlines at its start (lead) and/or end (trail), as Python's strip('\n'). */
static text_field strip_newlines(text_field s, bool lead, bool trail) {
    while (lead && s.len && s.s[0] == '\n') s.s++, s.len--;
    while (trail && s.len && s.s[s.len - 1] == '\n') s.len--;
    return s;
}

/* The first / last occurrence of needle in s, or NULL. */
static const char *find_first(text_field s, const char *needle) {
    return memmem(s.s, s.len, needle, strlen(needle));
}
static const char *find_last(text_field s, const char *needle) {
    const char *last = NULL;
    for (const char *p = s.s; (p = find_first((text_field){p, (size_t)(s.s + s.len - p)}, needle)); p++)
        last = p;
    return last;
}

/* Qwen3's split of an assistant turn into reasoning and content (see chat_template.h). */
static void qwen3_split(text_field c, text_field *reasoning, text_field *content) {
    const char *end = find_first(c, "</think>");
    *reasoning = (text_field){"", 0};
    *content = c;
    if (!end) return;
    const char *last_end = find_last(c, "</think>") + 8;
    *content = strip_newlines((text_field){last_end, (size_t)(c.s + c.len - last_end)}, true, false);
    text_field before = strip_newlines((text_field){c.s, (size_t)(end - c.s)}, false, true);
    const char *open = find_last(before, "<think>");
    if (open) before = (text_field){open + 7, (size_t)(before.s + before.len - open - 7)};
    *reasoning = strip_newlines(before, true, false);
}

/* The last user turn that is not a tool response (Qwen3's last query), or n - 1. */
static size_t qwen3_last_query(const chat_msg *m, size_t n) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    for (size_t i = n; i-- > 0;) {
        if (m[i].role != ROLE_USER) continue;
        bool tool = m[i].len >= sizeof open - 1 + sizeof close - 1 && !memcmp(m[i].text, open, sizeof open - 1) &&
                    !memcmp(m[i].text + m[i].len - (sizeof close - 1), close, sizeof close - 1);
        if (!tool) return i;
    }
    return n ? n - 1 : 0;
}

static int render_qwen3(const tpl_tokens *tok, const chat_msg *m, size_t n, tpl_segs *out) {
    static const text_field none = {"", 0};
    size_t last_query = qwen3_last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        text_field c = {m[i].text, m[i].len}, reasoning, content;
        if (m[i].role != ROLE_ASSISTANT) {
            if (chatml_turn(tok, m[i].role, none, c, out)) return -1;
            continue;
        }
        qwen3_split(c, &reasoning, &content);
        bool think = i > last_query && (i == n - 1 || reasoning.len);
        if (!think) {
            if (chatml_turn(tok, ROLE_ASSISTANT, none, content, out)) return -1;
            continue;
        }
        reasoning = strip_newlines(reasoning, true, true);
        content = strip_newlines(content, true, false);
        if (tpl_control(out, tok->im_start, false) || LIT(out, "assistant\n", false) ||
            LIT(out, "<think>\n", true) || tpl_text(out, reasoning.s, reasoning.len, true) ||
            LIT(out, "\n</think>\n\n", true) || tpl_text(out, content.s, content.len, true) ||
            tpl_control(out, tok->im_end, true) || LIT(out, "\n", false))
            return -1;
    }
    return 0;
}

/* Roles alternate user/assistant after an optional first system message (the [INST]
 * templates); the system message's text, or NULL. */
static int inst_roles(const char *name, const chat_msg **m, size_t *n, text_field *sys, errbuf *err) {
    *sys = (text_field){NULL, 0};
    if (*n && (*m)[0].role == ROLE_SYSTEM) {
        *sys = (text_field){(*m)[0].text, (*m)[0].len};
        (*m)++, (*n)--;
    }
    for (size_t i = 0; i < *n; i++) {
        chat_role want = i % 2 ? ROLE_ASSISTANT : ROLE_USER;
        if ((*m)[i].role != want)
            return errf(err, "template %s: turn %zu is %s where %s comes (roles alternate "
                             "user/assistant after an optional first system message)",
                        name, i + (sys->s != NULL), role_names[(*m)[i].role], role_names[want]);
    }
    return 0;
}

/* Mistral's user text: S "\n\n" U where the system message goes, else U. */
static int mistral_user(text_field sys, bool with_sys, const chat_msg *u, tpl_segs *out) {
    if (with_sys && sys.s && (tpl_text(out, sys.s, sys.len, false) || LIT(out, "\n\n", false))) return -1;
    return tpl_text(out, u->text, u->len, false);
}

/* mistral, mistral-v3 and mistral-tekken (t). */
static int render_mistral(const tpl_tokens *tok, const chat_msg *m, size_t n, chat_template t,
                          tpl_segs *out, errbuf *err) {
    text_field sys;
    if (inst_roles(chat_template_name(t), &m, &n, &sys, err)) return -1;
    size_t last_user = n && m[n - 1].role == ROLE_USER ? n - 1 : n - 2; /* n - 2 >= 0: roles alternate */
    bool v3 = t == TPL_MISTRAL_V3, tekken = t == TPL_MISTRAL_TEKKEN;
    int rc = tpl_control(out, tok->bos, false);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (m[i].role == ROLE_USER && (v3 || tekken))
            rc = tpl_control(out, tok->inst, false) || (v3 && LIT(out, " ", false)) ||
                 mistral_user(sys, i == last_user, &m[i], out) || tpl_control(out, tok->inst_end, false);
        else if (m[i].role == ROLE_USER)
            rc = LIT(out, " [INST] ", false) || mistral_user(sys, i == 0, &m[i], out) ||
                 LIT(out, " [/INST]", false);
        else {
            text_field c = v3 ? py_strip(m[i].text, m[i].len) : (text_field){m[i].text, m[i].len};
            rc = (!tekken && LIT(out, " ", true)) || tpl_text(out, c.s, c.len, true) ||
                 tpl_control(out, tok->eos, true);
        }
    }
    return rc ? errf(err, "out of memory") : 0;
}

int alpaca_render(const tpl_tokens *tok, text_field instruction, text_field input,
                  text_field output, tpl_segs *out, errbuf *err) {
    int rc = 0;
    for (size_t i = 0; i < tok->n_prefix; i++) rc = rc || tpl_control(out, tok->prefix[i], false);
    if (input.len) {
        rc = rc || LIT(out, "Below is an instruction that describes a task, paired with an input that "
                            "provides further context. Write a response that appropriately completes "
                            "the request.\n\n### Instruction:\n", false) ||
             tpl_text(out, instruction.s, instruction.len, false) ||
             LIT(out, "\n\n### Input:\n", false) || tpl_text(out, input.s, input.len, false);
    } else {
        rc = rc || LIT(out, "Below is an instruction that describes a task. Write a response that "
                            "appropriately completes the request.\n\n### Instruction:\n", false) ||
             tpl_text(out, instruction.s, instruction.len, false);
    }
    rc = rc || LIT(out, "\n\n### Response:", false) || tpl_text(out, output.s, output.len, true) ||
         tpl_control(out, tok->eos, true);
    return rc ? errf(err, "out of memory") : 0;
}

int chat_render(chat_template t, const tpl_tokens *tok, const chat_msg *m, size_t n,
                tpl_segs *out, errbuf *err) {
    out->n = 0;
    switch (t) {
    case TPL_LLAMA3: return render_llama3(tok, m, n, out) ? errf(err, "out of memory") : 0;
    case TPL_LLAMA2: return render_llama2(tok, m, n, out, err);
    case TPL_CHATML:
    case TPL_QWEN25:
    case TPL_QWEN2: {
        const char *sys = t == TPL_QWEN25 ? QWEN25_SYSTEM : t == TPL_QWEN2 ? QWEN2_SYSTEM : NULL;
        return render_chatml(tok, m, n, sys, out) ? errf(err, "out of memory") : 0;
    }
    case TPL_QWEN3: return render_qwen3(tok, m, n, out) ? errf(err, "out of memory") : 0;
    case TPL_MISTRAL:
    case TPL_MISTRAL_V3:
    case TPL_MISTRAL_TEKKEN: return render_mistral(tok, m, n, t, out, err);
    case TPL_ALPACA:
        if (n != 2 || m[0].role != ROLE_USER || m[1].role != ROLE_ASSISTANT)
            return errf(err, "template alpaca: a conversation of one user turn and one assistant "
                             "turn (this one has %zu turns)", n);
        return alpaca_render(tok, (text_field){m[0].text, m[0].len}, (text_field){"", 0},
                             (text_field){m[1].text, m[1].len}, out, err);
    case TPL_NONE:
    case TPL_COUNT: break;
    }
    return errf(err, "data.template: chat data needs a template");
}
