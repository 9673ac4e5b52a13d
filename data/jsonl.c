/* jsonl: a JSONL file's lines read as records of their format; see jsonl.h. */
#include "data/jsonl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jsonl_cursor_init(jsonl_cursor *c, const char *buf, size_t len) {
    c->p = buf;
    c->end = buf + len;
    c->line_no = 0;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\f\v", s[i]) || !s[i]) return false;
    return true;
}

bool jsonl_next(jsonl_cursor *c, const char **line, size_t *len) {
    while (c->p < c->end) {
        const char *nl = memchr(c->p, '\n', (size_t)(c->end - c->p));
        const char *stop = nl ? nl : c->end;
        *line = c->p;
        *len = (size_t)(stop - c->p);
        c->p = nl ? nl + 1 : c->end;
        c->line_no++;
        if (!blank(*line, *len)) return true;
    }
    return false;
}

void record_clear(data_record *r) {
    json_decref(r->root);
    r->root = NULL;
    r->n_msgs = 0;
    memset(&r->instruction, 0, sizeof r->instruction);
    memset(&r->input, 0, sizeof r->input);
    memset(&r->output, 0, sizeof r->output);
    memset(&r->text, 0, sizeof r->text);
    r->pref_conversational = false;
    r->prompt = r->chosen = r->rejected = (text_field){NULL, 0};
    memset(r->conv, 0, sizeof r->conv);
}

void record_free(data_record *r) {
    record_clear(r);
    free(r->msgs);
    memset(r, 0, sizeof *r);
}

/* obj[key] as a string; optional keys may be absent or null (then ""). */
static int get_string(json_t *obj, const char *key, bool optional, text_field *out,
                      const char *where, errbuf *err) {
    json_t *v = json_object_get(obj, key);
    if (optional && (!v || json_is_null(v))) {
        out->s = "";
        out->len = 0;
        return 0;
    }
    const char *sep = *where ? ": " : "";
    if (!v) return errf(err, "%s%sno \"%s\" field", where, sep, key);
    if (!json_is_string(v)) return errf(err, "%s%s\"%s\" is not a string", where, sep, key);
    out->s = json_string_value(v);
    out->len = json_string_length(v);
    return 0;
}

static int push_msg(data_record *r, chat_role role, text_field t, errbuf *err) {
    if (r->n_msgs == r->cap_msgs) {
        size_t cap = r->cap_msgs ? 2 * r->cap_msgs : 16;
        chat_msg *m = realloc(r->msgs, cap * sizeof *m);
        if (!m) return errf(err, "out of memory");
        r->msgs = m;
        r->cap_msgs = cap;
    }
    r->msgs[r->n_msgs++] = (chat_msg){role, t.s, t.len};
    return 0;
}

typedef struct role_name {
    const char *name;
    chat_role role;
} role_name;

static const role_name message_roles[] = {
    {"system", ROLE_SYSTEM}, {"user", ROLE_USER}, {"assistant", ROLE_ASSISTANT}, {NULL, 0}};
static const role_name sharegpt_roles[] = {
    {"system", ROLE_SYSTEM}, {"human", ROLE_USER}, {"user", ROLE_USER},
    {"gpt", ROLE_ASSISTANT}, {"assistant", ROLE_ASSISTANT}, {NULL, 0}};

/* list[i] = {role_key: name, text_key: S} for every i. */
static int read_turns(data_record *r, json_t *list, const char *list_key, const char *role_key,
                      const char *text_key, const role_name *roles, bool need_assistant,
                      errbuf *err) {
    bool any_assistant = false;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *m = json_array_get(list, i);
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", list_key, i);
        if (!json_is_object(m)) return errf(err, "%s is not an object", where);
        text_field role, text;
        if (get_string(m, role_key, false, &role, where, err)) return -1;
        const role_name *k = roles;
        while (k->name && (strlen(k->name) != role.len || memcmp(k->name, role.s, role.len)))
            k++;
        if (!k->name)
            return errf(err, "%s.%s: \"%.40s\" is not one of %s", where, role_key, role.s,
                        roles == message_roles ? "system, user, assistant"
                                               : "system, human, user, gpt, assistant");
        if (get_string(m, text_key, false, &text, where, err) || push_msg(r, k->role, text, err))
            return -1;
        any_assistant |= k->role == ROLE_ASSISTANT;
    }
    if (need_assistant && !any_assistant) return errf(err, "\"%s\" has no assistant turn (nothing to learn)", list_key);
    return 0;
}

static int parse_chat(data_record *r, json_t *root, bool need_assistant, errbuf *err) {
    json_t *messages = json_object_get(root, "messages");
    json_t *conversations = json_object_get(root, "conversations");
    if (json_is_array(messages))
        return read_turns(r, messages, "messages", "role", "content", message_roles,
                          need_assistant, err);
    if (json_is_array(conversations))
        return read_turns(r, conversations, "conversations", "from", "value", sharegpt_roles,
                          need_assistant, err);
    return errf(err, "no \"messages\" or \"conversations\" list");
}

/* The line's JSON object into r->root. */
static int load_object(data_record *r, const char *line, size_t len, errbuf *err) {
    record_clear(r);
    json_error_t je;
    /* no JSON_ALLOW_NUL: a string with \u0000 in it is refused here */
    json_t *root = json_loadb(line, len, 0, &je);
    if (!root) return errf(err, "not JSON: %s (column %d)", je.text, je.column);
    r->root = root;
    if (!json_is_object(root)) return errf(err, "not a JSON object");
    return 0;
}

int record_parse_prompt(data_record *r, const char *line, size_t len, text_field *reference,
                        errbuf *err) {
    *reference = (text_field){NULL, 0};
    if (load_object(r, line, len, err) || parse_chat(r, r->root, false, err)) return -1;
    if (r->n_msgs && r->msgs[r->n_msgs - 1].role == ROLE_ASSISTANT) {
        r->n_msgs--;
        *reference = (text_field){r->msgs[r->n_msgs].text, r->msgs[r->n_msgs].len};
    }
    if (!r->n_msgs || r->msgs[r->n_msgs - 1].role != ROLE_USER)
        return errf(err, "the conversation does not end with a user turn (or a user turn and "
                         "the assistant's reply)");
    return push_msg(r, ROLE_ASSISTANT, (text_field){"", 0}, err);
}

/* A preference field: a string (*list false) or a non-empty list of messages. */
static int pref_field(json_t *root, const char *key, json_t **v, bool *list, errbuf *err) {
    *v = json_object_get(root, key);
    if (!*v) return errf(err, "no \"%s\" field", key);
    *list = json_is_array(*v);
    if (!*list && !json_is_string(*v))
        return errf(err, "\"%s\" is neither a string nor a list of messages", key);
    if (*list && !json_array_size(*v)) return errf(err, "\"%s\" is an empty list", key);
    return 0;
}

static bool same_msg(const chat_msg *a, const chat_msg *b) {
    return a->role == b->role && a->len == b->len && !memcmp(a->text, b->text, a->len);
}

/* The implicit prompt of two strings: extract_prompt's index, the first character where they
 * differ, one less after a space; -1 when they do not differ, -2 when they differ at once. */
static long string_prompt_end(text_field c, text_field r) {
    size_t n = c.len < r.len ? c.len : r.len, i = 0;
    while (i < n && c.s[i] == r.s[i]) i++;
    if (i == n) return -1;
    while (i > 0 && ((unsigned char)c.s[i] & 0xC0) == 0x80) i--; /* the differing code point's start */
    if (i == 0) return -2;
    return c.s[i - 1] == ' ' ? (long)i - 1 : (long)i;
}

/* Strings: prompt, chosen, rejected (split off chosen and rejected when implicit). */
static int pref_strings(data_record *r, json_t *prompt, json_t *chosen, json_t *rejected, errbuf *err) {
    r->chosen = (text_field){json_string_value(chosen), json_string_length(chosen)};
    r->rejected = (text_field){json_string_value(rejected), json_string_length(rejected)};
    if (prompt) {
        r->prompt = (text_field){json_string_value(prompt), json_string_length(prompt)};
        return 0;
    }
    long k = string_prompt_end(r->chosen, r->rejected);
    if (k < 0)
        return errf(err, "no \"prompt\", and chosen and rejected %s: no implicit prompt",
                    k == -2 ? "differ from their first character" : "do not differ (one is the other's start)");
    r->prompt = (text_field){r->chosen.s, (size_t)k};
    r->chosen.s += k, r->chosen.len -= (size_t)k;
    r->rejected.s += k, r->rejected.len -= (size_t)k;
    return 0;
}

static int read_list(data_record *r, json_t *list, const char *key, errbuf *err) {
    return read_turns(r, list, key, "role", "content", message_roles, false, err);
}

/* Lists: msgs = prompt, chosen, prompt, rejected (explicit) or chosen, rejected (implicit: the
 * prompt their common first messages), then the prompt again and an empty assistant turn. */
static int pref_lists(data_record *r, json_t *prompt, json_t *chosen, json_t *rejected, errbuf *err) {
    size_t np = prompt ? json_array_size(prompt) : 0;
    if ((prompt && read_list(r, prompt, "prompt", err)) || read_list(r, chosen, "chosen", err) ||
        (prompt && read_list(r, prompt, "prompt", err)) || read_list(r, rejected, "rejected", err))
        return -1;
    size_t nc = json_array_size(chosen), nr = json_array_size(rejected);
    if (!prompt) {
        const chat_msg *c = r->msgs, *rj = r->msgs + nc;
        while (np < nc && np < nr && same_msg(&c[np], &rj[np])) np++;
        if (np == 0 || np == nc || np == nr)
            return errf(err, "no \"prompt\", and chosen and rejected %s: no implicit prompt",
                        np ? "do not differ (one is the other's start)" : "differ from their first message");
        nc -= np, nr -= np;
    }
    r->conv[PREF_CHOSEN].start = 0, r->conv[PREF_CHOSEN].n = np + nc;
    r->conv[PREF_REJECTED].start = np + nc, r->conv[PREF_REJECTED].n = np + nr;
    r->conv[PREF_PROMPT].start = 2 * np + nc + nr, r->conv[PREF_PROMPT].n = np + 1;
    if (r->msgs[np - 1].role != ROLE_USER) return errf(err, "the prompt does not end with a user turn");
    if (r->msgs[np].role != ROLE_ASSISTANT || r->msgs[2 * np + nc].role != ROLE_ASSISTANT)
        return errf(err, "%s does not start with an assistant turn",
                    r->msgs[np].role != ROLE_ASSISTANT ? "chosen" : "rejected");
    for (size_t i = 0; i < np; i++)
        if (push_msg(r, r->msgs[i].role, (text_field){r->msgs[i].text, r->msgs[i].len}, err)) return -1;
    return push_msg(r, ROLE_ASSISTANT, (text_field){"", 0}, err);
}

static int parse_preference(data_record *r, json_t *root, errbuf *err) {
    static const char *const unbuilt[] = {"tools", "chat_template_kwargs", "images", "image"};
    for (size_t i = 0; i < sizeof unbuilt / sizeof unbuilt[0]; i++) {
        json_t *v = json_object_get(root, unbuilt[i]);
        if (v && !json_is_null(v)) /* TRL hands them to the template or the processor */
            return errf(err, "\"%s\": preference records with it are not built yet", unbuilt[i]);
    }
    json_t *prompt = NULL, *chosen, *rejected;
    bool lp = false, lc, lr;
    if (json_object_get(root, "prompt") && pref_field(root, "prompt", &prompt, &lp, err)) return -1;
    if (pref_field(root, "chosen", &chosen, &lc, err) || pref_field(root, "rejected", &rejected, &lr, err))
        return -1;
    if (lc != lr || (prompt && lp != lc))
        return errf(err, "%s is a %s but chosen is a %s: the three are all strings or all lists of messages",
                    lc != lr ? "rejected" : "prompt", (lc != lr ? lr : lp) ? "list" : "string", lc ? "list" : "string");
    r->pref_conversational = lc;
    return lc ? pref_lists(r, prompt, chosen, rejected, err) : pref_strings(r, prompt, chosen, rejected, err);
}

int record_pref_kind(const char *line, size_t len, bool *conversational) {
    json_t *root = json_loadb(line, len, 0, NULL);
    json_t *chosen = json_object_get(root, "chosen");
    int known = json_is_array(chosen) || json_is_string(chosen);
    *conversational = json_is_array(chosen);
    json_decref(root);
    return known;
}

int record_parse(data_record *r, job_data_format format, const char *text_field, const char *line,
                 size_t len, errbuf *err) {
    if (load_object(r, line, len, err)) return -1;
    json_t *root = r->root;
    switch (format) {
    case JOB_DATA_ALPACA:
        return get_string(root, "instruction", false, &r->instruction, "", err) ||
                       get_string(root, "input", true, &r->input, "", err) ||
                       get_string(root, "output", false, &r->output, "", err)
                   ? -1
                   : 0;
    case JOB_DATA_CHAT: return parse_chat(r, root, true, err);
    case JOB_DATA_TEXT: return get_string(root, text_field, false, &r->text, "", err);
    case JOB_DATA_PREFERENCE: return parse_preference(r, root, err);
    case JOB_DATA_TOKENS:
    case JOB_DATA_AUTO: break;
    }
    return errf(err, "data.format %s has no JSONL records", job_data_format_name(format));
}

int record_guess_format(const char *line, size_t len, const char *text_field, job_data_format *out,
                        char *why, size_t why_n, errbuf *err) {
    json_error_t je;
    json_t *root = json_loadb(line, len, 0, &je);
    if (!root) return errf(err, "the first record is not JSON: %s (column %d)", je.text, je.column);
    int rc = 0;
    if (!json_is_object(root)) rc = errf(err, "the first record is not a JSON object");
    else if (json_object_get(root, "messages") || json_object_get(root, "conversations")) {
        *out = JOB_DATA_CHAT;
        snprintf(why, why_n, "its first record has %s", json_object_get(root, "messages") ? "messages" : "conversations");
    } else if (json_object_get(root, "chosen") && json_object_get(root, "rejected")) {
        *out = JOB_DATA_PREFERENCE;
        snprintf(why, why_n, "its first record has chosen and rejected");
    } else if (json_object_get(root, "instruction") && json_object_get(root, "output")) {
        *out = JOB_DATA_ALPACA;
        snprintf(why, why_n, "its first record has instruction and output");
    } else if (json_object_get(root, text_field)) {
        *out = JOB_DATA_TEXT;
        snprintf(why, why_n, "its first record has %s", text_field);
    } else {
        rc = errf(err, "the first record has none of messages, conversations, chosen + rejected, instruction + "
                       "output, or %s: set data.format (alpaca, chat, text or preference) and for text "
                       "data.text_field", text_field);
    }
    json_decref(root);
    return rc;
}
