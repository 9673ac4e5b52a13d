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
    } else if (json_object_get(root, "instruction") && json_object_get(root, "output")) {
        *out = JOB_DATA_ALPACA;
        snprintf(why, why_n, "its first record has instruction and output");
    } else if (json_object_get(root, text_field)) {
        *out = JOB_DATA_TEXT;
        snprintf(why, why_n, "its first record has %s", text_field);
    } else {
        rc = errf(err, "the first record has none of messages, conversations, instruction + output, or %s: set "
                       "data.format (alpaca, chat or text) and for text data.text_field", text_field);
    }
    json_decref(root);
    return rc;
}
