/* step_scalars: what TensorBoard and MLflow get of a step; see step_scalars.h. */
#include "daemon/step_scalars.h"

size_t step_scalars(const msg_metrics *m, step_scalar out[STEP_SCALARS_MAX]) {
    size_t n = 0;
    out[n++] = (step_scalar){"train/loss", m->loss};
    out[n++] = (step_scalar){"train/lr", m->lr};
    out[n++] = (step_scalar){"train/grad_norm", m->grad_norm};
    out[n++] = (step_scalar){"train/tokens_per_s", m->seconds > 0 ? (double)m->tokens / m->seconds : 0.0};
    out[n++] = (step_scalar){"memory/bytes", (double)m->mem_bytes};
    out[n++] = (step_scalar){"memory/peak_bytes", (double)m->mem_peak_bytes};
    if (m->has_eval_loss) out[n++] = (step_scalar){"eval/loss", m->eval_loss};
    return n;
}
