/* chat_template: the built-in chat templates, and data.template auto; see chat_template.h. */
#include "data/chat_template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/path.h"

static const char *const template_names[TPL_COUNT] = {"none", "llama3", "llama2", "chatml",
                                                      "alpaca"};

int chat_template_parse(const char *name, chat_template *t, errbuf *err) {
    *t = TPL_NONE;
    if (!name[0] || !strcmp(name, "auto")) return 0;
    for (int i = 1; i < TPL_COUNT; i++)
        if (!strcmp(name, template_names[i])) {
            *t = (chat_template)i;
            return 0;
        }
    return errf(err, "data.template: '%s' is not one of llama3, llama2, chatml, alpaca, auto", name);
}

const char *chat_template_name(chat_template t) {
    return t >= 0 && t < TPL_COUNT ? template_names[t] : "unknown";
}

/* Each built-in template by the strings its Jinja form always holds. */
chat_template chat_template_recognise(const char *jinja) {
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>")) return TPL_LLAMA3;
    if (strstr(jinja, "[INST]") && strstr(jinja, "[/INST]")) return TPL_LLAMA2;
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "<|im_end|>")) return TPL_CHATML;
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
                         "llama3, llama2, chatml or alpaca", path, ignored.msg);
    json_t *cfg = tokenizer_config_parse(text, len, path, err);
    free(text);
    if (!cfg) return errprefix(err, "data.template: auto");
    const char *jinja = config_template(cfg);
    *t = jinja ? chat_template_recognise(jinja) : TPL_NONE;
    json_decref(cfg);
    if (*t == TPL_NONE)
        return errf(err, "data.template: auto found %s in %s; set data.template to llama3, "
                         "llama2, chatml or alpaca",
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
    case TPL_CHATML:
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

static int render_chatml(const tpl_tokens *tok, const chat_msg *m, size_t n, tpl_segs *out) {
    for (size_t i = 0; i < n; i++) {
        bool loss = m[i].role == ROLE_ASSISTANT;
        const char *role = role_names[m[i].role];
        if (tpl_control(out, tok->im_start, false) || tpl_text(out, role, strlen(role), false) ||
            LIT(out, "\n", false) || tpl_text(out, m[i].text, m[i].len, loss) ||
            tpl_control(out, tok->im_end, loss) || LIT(out, "\n", false))
            return -1;
    }
    return 0;
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
    case TPL_CHATML: return render_chatml(tok, m, n, out) ? errf(err, "out of memory") : 0;
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
