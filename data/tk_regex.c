/* Compiling a tokenizer.json regex with PCRE2 so that it matches as tokenizers' Oniguruma does:
 * \p{L}, \p{N}, \s, the categories \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm}, \p{Lo}, \p{M} (Mistral's
 * tekken pattern) and their negations are spelt out as the code point ranges of
 * data/tk_unicode.c (Oniguruma's Unicode version, not PCRE2's: 10.42 knows Unicode 14, so the
 * letters and digits added since, and U+180E, which PCRE2 counts as a space, would split
 * differently).  Everything else of the pattern is PCRE2's own, in UTF + UCP mode. */
#include <stdio.h>
#include <string.h>

#include "data/tk_internal.h"

extern const uint32_t tk_unicode_letter[][2], tk_unicode_number[][2], tk_unicode_space[][2],
    tk_unicode_upper[][2], tk_unicode_lower[][2], tk_unicode_title[][2], tk_unicode_modifier[][2],
    tk_unicode_other_letter[][2], tk_unicode_mark[][2];
extern const size_t tk_unicode_letter_n, tk_unicode_number_n, tk_unicode_space_n, tk_unicode_upper_n,
    tk_unicode_lower_n, tk_unicode_title_n, tk_unicode_modifier_n, tk_unicode_other_letter_n,
    tk_unicode_mark_n;

typedef struct uset {
    const uint32_t (*r)[2];
    size_t n;
} uset;

/* The \p{...} names spelt out: the short and the long one of each category. */
static const struct {
    const char *name, *long_name;
    const uint32_t (*r)[2];
    const size_t *n;
} categories[] = {
    {"L", "Letter", tk_unicode_letter, &tk_unicode_letter_n},
    {"N", "Number", tk_unicode_number, &tk_unicode_number_n},
    {"Lu", "Uppercase_Letter", tk_unicode_upper, &tk_unicode_upper_n},
    {"Ll", "Lowercase_Letter", tk_unicode_lower, &tk_unicode_lower_n},
    {"Lt", "Titlecase_Letter", tk_unicode_title, &tk_unicode_title_n},
    {"Lm", "Modifier_Letter", tk_unicode_modifier, &tk_unicode_modifier_n},
    {"Lo", "Other_Letter", tk_unicode_other_letter, &tk_unicode_other_letter_n},
    {"M", "Mark", tk_unicode_mark, &tk_unicode_mark_n},
};

static int put_range(tk_buf *out, uint32_t a, uint32_t b) {
    char s[40];
    int k = a == b ? snprintf(s, sizeof s, "\\x{%X}", a) : snprintf(s, sizeof s, "\\x{%X}-\\x{%X}", a, b);
    return tk_buf_put(out, s, (size_t)k);
}

/* [a, b] without the surrogates, which a UTF pattern may not name. */
static int put_valid_range(tk_buf *out, uint32_t a, uint32_t b) {
    if (a < 0xD800 && b > 0xDFFF) return put_range(out, a, 0xD7FF) || put_range(out, 0xE000, b);
    if (a >= 0xD800 && a <= 0xDFFF) a = 0xE000;
    if (b >= 0xD800 && b <= 0xDFFF) b = 0xD7FF;
    return a <= b ? put_range(out, a, b) : 0;
}

/* The set's ranges (or its complement's) as class contents. */
static int put_set(tk_buf *out, uset set, int negate) {
    if (!negate) {
        for (size_t i = 0; i < set.n; i++)
            if (put_range(out, set.r[i][0], set.r[i][1])) return -1;
        return 0;
    }
    uint32_t next = 0;
    for (size_t i = 0; i < set.n; i++) {
        if (set.r[i][0] > next && put_valid_range(out, next, set.r[i][0] - 1)) return -1;
        next = set.r[i][1] + 1;
    }
    return next <= 0x10FFFF ? put_valid_range(out, next, 0x10FFFF) : 0;
}

/* The set an escape at p (after the backslash) names, and its length; 0 when none. */
static size_t class_escape(const char *p, size_t n, uset *set, int *negate) {
    *set = (uset){NULL, 0};
    *negate = n && (p[0] == 'P' || p[0] == 'S');
    if (n && (p[0] == 's' || p[0] == 'S')) {
        *set = (uset){tk_unicode_space, tk_unicode_space_n};
        return 1;
    }
    if (n < 3 || (p[0] != 'p' && p[0] != 'P') || p[1] != '{') return 0;
    const char *end = memchr(p + 2, '}', n - 2);
    if (!end) return 0;
    size_t len = (size_t)(end - (p + 2));
    const char *name = p + 2;
    for (size_t i = 0; i < sizeof categories / sizeof categories[0]; i++)
        if ((len == strlen(categories[i].name) && !memcmp(name, categories[i].name, len)) ||
            (len == strlen(categories[i].long_name) && !memcmp(name, categories[i].long_name, len))) {
            *set = (uset){categories[i].r, *categories[i].n};
            return len + 3;
        }
    return 0;
}

/* The bytes of a class opening at p ("[", "[^", and a ']' right after them, a literal). */
static size_t class_open_len(const char *p, size_t n) {
    size_t k = 1;
    if (k < n && p[k] == '^') k++;
    if (k < n && p[k] == ']') k++;
    return k;
}

int tk_regex_rewrite(const char *p, size_t n, tk_buf *out) {
    int in_class = 0;
    size_t i = 0;
    out->n = 0;
    while (i < n) {
        size_t k = 1;
        if (p[i] == '\\' && i + 1 < n) {
            uset set;
            int negate;
            size_t e = class_escape(p + i + 1, n - i - 1, &set, &negate);
            if (e) {
                int rc = in_class ? put_set(out, set, negate)
                                  : tk_buf_put(out, negate ? "[^" : "[", negate ? 2 : 1) ||
                                        put_set(out, set, 0) || tk_buf_put(out, "]", 1);
                if (rc) return -1;
                i += e + 1;
                continue;
            }
            k = 2;
            if (p[i + 1] == 'Q') { /* \Q...\E is literal */
                const char *end = memmem(p + i + 2, n - i - 2, "\\E", 2);
                k = end ? (size_t)(end - (p + i)) + 2 : n - i;
            }
        } else if (in_class && p[i] == '[' && i + 1 < n && p[i + 1] == ':') {
            const char *end = memmem(p + i, n - i, ":]", 2);
            k = end ? (size_t)(end - (p + i)) + 2 : 1;
        } else if (in_class && p[i] == ']') in_class = 0;
        else if (!in_class && p[i] == '[') {
            in_class = 1;
            k = class_open_len(p + i, n - i);
        }
        if (tk_buf_put(out, p + i, k)) return -1;
        i += k;
    }
    return tk_buf_put(out, "", 0);
}
