/* peft: PEFT LoRA adapter directories in and out (DESIGN.md, LoRA and QLoRA) — what
 * `PeftModel.from_pretrained` loads and `save_pretrained` writes (PEFT 0.21):
 *
 *   adapter_config.json        LoraConfig as JSON (indent 2, sorted keys)
 *   adapter_model.safetensors  the adapters under PEFT's saved names
 *                              (base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight),
 *                              no ".default" (that is PEFT's in-memory adapter name)
 *
 * Reading is strict: peft_type "LORA"; target_modules a list of q_proj..down_proj or
 * "all-linear" (PEFT: every linear of a layer, not lm_head); what fsdpd does not build
 * (DoRA, biases, fan_in_fan_out, per-module ranks or alphas, a subset of layers,
 * modules_to_save, PiSSA-like inits that change the base, ...) is refused with "not built
 * yet" naming the key.  Missing optional keys take LoraConfig's defaults: r 8, lora_alpha 8,
 * lora_dropout 0, use_rslora false, target_modules PEFT's Llama default [q_proj, v_proj].
 * Keys this reader does not know (later PEFT versions add some) are ignored. */
#ifndef FSDP_PEFT_H
#define FSDP_PEFT_H

#include <stddef.h>

#include "base/errbuf.h"
#include "lora_layout.h"
#include "model_config.h"

#define PEFT_CONFIG_NAME "adapter_config.json"
#define PEFT_WEIGHTS_NAME "adapter_model.safetensors"
#define PEFT_VERSION "0.21.0" /* the peft_version written */
#define PEFT_CONFIG_MAX (1u << 20)
#define PEFT_MAX_RANK 65536

/* ---- adapter_config.json ---- */

/* The config's text (malloc'd, NUL-terminated, ends with a newline): every key PEFT 0.21
 * writes, features fsdpd does not build at their neutral values, base_model_name_or_path =
 * base_model. */
char *peft_config_text(const lora_config *c, const char *base_model, errbuf *err);
/* Writes it into path atomically (base/fileio.h file_write_atomic). */
int peft_write_config(const char *path, const lora_config *c, const char *base_model,
                      errbuf *err);
/* Parses adapter_config.json text (see above); `name` starts every message.  The fuzzing
 * entry point. */
int peft_parse_config(lora_config *c, const char *text, size_t len, const char *name,
                      errbuf *err);
int peft_read_config(lora_config *c, const char *path, errbuf *err);

/* ---- adapter_model.safetensors ---- */

/* The adapters as per-layer fp32 flat buffers laid out by lo: units[l] holds
 * lo->units[l].numel floats. */
float **peft_units_new(const lora_layout *lo, errbuf *err);
void peft_units_free(float **units, int n_units);
/* Reads path into units: every tensor of lo present with its shape, in F32, BF16 or F16; a
 * tensor lo does not know is an error naming it. */
int peft_read_weights(const char *path, const lora_layout *lo, float *const *units,
                      errbuf *err);
/* Writes units into path (F32, metadata {"format": "pt"}, tensors sorted by name as the
 * safetensors package writes them; atomic). */
int peft_write_weights(const char *path, const lora_layout *lo, const float *const *units,
                       errbuf *err);

/* ---- the directory ---- */

/* Reads dir's config, lays the adapters out for a model of config mcfg (lo, to be freed with
 * lora_layout_free) and reads the weights into *units (peft_units_free). */
int peft_load(const char *dir, const llama_config *mcfg, lora_layout *lo, float ***units,
              errbuf *err);
/* Writes dir/adapter_model.safetensors and dir/adapter_config.json (dir must exist). */
int peft_save(const char *dir, const lora_layout *lo, const float *const *units,
              const char *base_model, errbuf *err);

#endif
