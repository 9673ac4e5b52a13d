/* chat_template: the built-in prompt templates, rendered as transformers'
 * apply_chat_template renders the models' Jinja templates, with the loss-bearing part of
 * each turn marked.  A rendered sample is a list of segments: text, or a control token
 * (its id, never text, so content that looks like "<|eot_id|>" stays plain text).
 *
 *   llama3  [bos] then per turn <|start_header_id|>ROLE<|end_header_id|>\n\n TRIM(content)
 *           <|eot_id|>; loss on an assistant turn's content and <|eot_id|>.  No trailing
 *           assistant header (the model's template always appends one: a training sample
 *           does not).
 *   llama2  the Llama-2-chat template: a first system message goes into the first user turn
 *           as <<SYS>>\nS\n<</SYS>>\n\n; user: [bos] "[INST] " STRIP(content) " [/INST]";
 *           assistant: " " STRIP(content) " " [eos], its loss from that first space
 *           through [eos]; roles alternate user/assistant.
 *   chatml  <|im_start|>ROLE\n content <|im_end|>\n; loss on an assistant turn's content and
 *           <|im_end|>.  Qwen2.5's template when the conversation opens with a system message.
 *   qwen2.5 Qwen2.5's template: chatml, with Qwen's default system message ("You are Qwen,
 *           created by Alibaba Cloud. You are a helpful assistant.") first when the
 *           conversation has none.
 *   qwen2   Qwen2's (and Qwen1.5's) Instruct template: the same with "You are a helpful
 *           assistant.".  Other ChatML templates are chatml.
 *   qwen3   Qwen3's template as it renders a whole conversation (no generation prompt):
 *           chatml without a default system message; an assistant turn's "<think>R</think>"
 *           is taken out of its content (R: the text after the last <think> before the first
 *           </think>, its newlines trimmed; the content: after the last </think>, leading
 *           newlines removed); the assistant turns after the last user turn get
 *           "<think>\nR\n</think>\n\n" before their content, an empty think block when R is
 *           empty for the last turn, nothing for the others; earlier turns lose R.  Loss on
 *           everything after "<|im_start|>assistant\n" through <|im_end|>: the think block is
 *           what the model learns to write.
 *   mistral Mistral-7B-Instruct v0.1/v0.2's template: [bos], user " [INST] " content
 *           " [/INST]" (the first with a system message as S "\n\n" U), assistant " " content
 *           [eos] (no strip); loss from that space through [eos]; roles alternate.  For the
 *           v0.1 SentencePiece vocabulary, where [INST] is text: a tokenizer with an [INST]
 *           token is refused (mistral-v3).
 *   mistral-v3  Mistral v0.3's: [bos], user [INST] " " content [/INST] (control tokens),
 *           assistant " " STRIP(content) [eos]; loss from that space through [eos]; roles
 *           alternate.  A system message joins the last user turn (S "\n\n" U), as the
 *           template does at inference and mistral-common always does (the Jinja template,
 *           given a conversation that ends with the assistant's turn, drops it).
 *   mistral-tekken  Mistral Nemo's (tekken vocabulary): as mistral-v3 without the spaces:
 *           [INST] content [/INST], assistant content [eos] (no strip); loss on the content
 *           and [eos].
 *   alpaca  fsdp_qlora's InstructionDataset prompt (with or without an input), the output
 *           right after "### Response:", then [eos]; loss on the output and [eos].  Chat data
 *           with it: one user turn (the instruction) and one assistant turn.
 *
 * STRIP/TRIM remove Python's str.strip() whitespace. */
#ifndef FSDP_DATA_CHAT_TEMPLATE_H
#define FSDP_DATA_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"

typedef enum chat_template {
    TPL_NONE = 0, /* text data, and token caches */
    TPL_LLAMA3 = 1,
    TPL_LLAMA2 = 2,
    TPL_CHATML = 3,
    TPL_ALPACA = 4,
    TPL_QWEN25 = 5,
    TPL_QWEN3 = 6,
    TPL_MISTRAL = 7,
    TPL_MISTRAL_V3 = 8,
    TPL_MISTRAL_TEKKEN = 9,
    TPL_QWEN2 = 10,
    TPL_COUNT
} chat_template;

/* The names, for messages. */
#define CHAT_TEMPLATE_NAMES \
    "llama3, llama2, chatml, qwen2, qwen2.5, qwen3, mistral, mistral-v3, mistral-tekken, alpaca"

/* A name of CHAT_TEMPLATE_NAMES -> the template; "auto" and "" -> TPL_NONE (the caller
 * resolves it); anything else is an error naming data.template. */
int chat_template_parse(const char *name, chat_template *t, errbuf *err);
const char *chat_template_name(chat_template t); /* "none" for TPL_NONE */
/* The built-in template that a model's Jinja chat_template is, or TPL_NONE: by the strings
 * each always holds (Llama 2's <<SYS>> block tells it from Mistral's [INST]; Mistral v0.1's
 * " [INST] " from v0.3's "[INST] " and Nemo's "[INST]" without a space). */
chat_template chat_template_recognise(const char *jinja);
/* The Jinja chat_template of t (NULL for TPL_NONE), which transformers' apply_chat_template
 * renders into the text whose tokens are chat_render's for a conversation that ends with an
 * assistant turn (and, with add_generation_prompt, the prompt sample_prompt_from_line gives
 * for one that ends with a user turn); chat_template_recognise gives t back.  alpaca: its
 * prompt without an input (chat data's one user turn). */
const char *chat_template_jinja(chat_template t);
/* The template of model_dir/tokenizer_config.json's chat_template; an error naming
 * data.template when it is missing or not recognised. */
int chat_template_from_model(const char *model_dir, chat_template *t, errbuf *err);

/* The control tokens a template needs, from the tokenizer (-1: not needed). */
typedef struct tpl_tokens {
    int32_t bos, eos, start_header, end_header, eot, im_start, im_end, inst, inst_end;
    const int32_t *prefix; /* the post-processor's leading ids (alpaca's BOS) */
    size_t n_prefix;
} tpl_tokens;

/* Refuses a tokenizer that lacks a token the template needs. */
int tpl_tokens_find(chat_template t, const tokenizer *tk, tpl_tokens *out, errbuf *err);

typedef struct tpl_seg {
    const char *s; /* text (NULL for a control token) */
    size_t len;
    int32_t id; /* a control token, or -1 */
    bool loss;
} tpl_seg;

typedef struct tpl_segs {
    tpl_seg *v;
    size_t n, cap;
} tpl_segs;

void tpl_segs_free(tpl_segs *s);
/* Appends a text segment / a control token. */
int tpl_text(tpl_segs *s, const char *text, size_t len, bool loss);
int tpl_control(tpl_segs *s, int32_t id, bool loss);

/* Renders a conversation (the segments point into msgs' text and static strings); a
 * conversation the template cannot take is an error saying why. */
int chat_render(chat_template t, const tpl_tokens *tok, const chat_msg *msgs, size_t n,
                tpl_segs *out, errbuf *err);
/* The alpaca prompt for instruction/input, then output and EOS. */
int alpaca_render(const tpl_tokens *tok, text_field instruction, text_field input,
                  text_field output, tpl_segs *out, errbuf *err);

/* s without Python's str.strip() whitespace at both ends (UTF-8), as a (start, length). */
text_field py_strip(const char *s, size_t len);

#endif
