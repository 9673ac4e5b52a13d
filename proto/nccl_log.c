/* nccl_log: see nccl_log.h. */
#include "proto/nccl_log.h"

#include <stdio.h>
#include <string.h>

/* Copies the word (or, for "Using network", the rest of the line) at p into out. */
static void take(const char *p, const char *end, int rest_of_line, char *out, size_t n) {
    size_t k = 0;
    while (p < end && *p != '\n' && *p != '\r' && (rest_of_line || (*p != ' ' && *p != ':' && *p != '/')) &&
           k + 1 < n)
        out[k++] = *p++;
    while (k > 0 && out[k - 1] == ' ') k--;
    out[k] = '\0';
}

static const char *find(const char *from, const char *end, const char *needle) {
    size_t m = strlen(needle);
    for (const char *p = from; p + m <= end; p++)
        if (memcmp(p, needle, m) == 0) return p;
    return NULL;
}

int nccl_log_transport(const char *text, size_t len, char *out, size_t n) {
    const char *end = text + len, *p;
    char using[64] = "", tag[64] = "";
    for (p = text; (p = find(p, end, "Using network ")) != NULL; p++) take(p + 14, end, 1, using, sizeof using);
    for (p = text; (p = find(p, end, "NET/")) != NULL; p++) {
        char word[64];
        take(p + 4, end, 0, word, sizeof word);
        if (word[0] && strcmp(word, "Plugin") != 0) snprintf(tag, sizeof tag, "%s", word);
    }
    snprintf(out, n, "%s", using[0] ? using : tag);
    return out[0] != '\0';
}

int nccl_transport_is_socket(const char *name) { return strcmp(name, "Socket") == 0; }
