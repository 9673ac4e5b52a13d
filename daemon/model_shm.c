/* model_shm: the model once per node in sealed shared memory; see model_shm.h. */
#include "daemon/model_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "proto/model_image.h"
#include "proto/nf4.h"

#define PROGRESS_MIN_BYTES (256u << 20) /* smaller models load too fast to report */

typedef struct progress_state {
    double start, last;
    int finished; /* the line for done == total is printed (the fill's own end reports it again) */
} progress_state;

static void print_progress(void *arg, size_t done, size_t total) {
    progress_state *p = arg;
    double t = clock_now_s();
    if (total < PROGRESS_MIN_BYTES || p->finished || (t - p->last < 1.0 && done < total)) return;
    p->last = t;
    p->finished = done >= total;
    double rate = done / 1e9 / (t - p->start > 1e-9 ? t - p->start : 1e-9);
    fprintf(stderr, "\rfsdpd: loading the model into shared memory: %3.0f%% (%.1f / %.1f GB, %.2f GB/s)%s",
            100.0 * (double)done / (double)total, done / 1e9, total / 1e9, rate,
            done >= total ? "\n" : "");
}

int model_shm_quant(const job_config *job, const json_t *config, model_image_quant *q, int *bnb,
                    errbuf *err) {
    nf4_model_quant mq;
    int rc = nf4_model_quant_parse(config, &mq, err);
    if (rc < 0) return errprefix(err, "%s/config.json", job->model.path);
    *bnb = rc == 0;
    if (*bnb && job->train.type != JOB_TRAIN_QLORA)
        return errf(err, "model.path: %s is a bitsandbytes 4-bit model: it trains with train.type "
                         "qlora only", job->model.path);
    if (*bnb && job->output.merge)
        return errf(err, "output.merge: merging adapters into a bitsandbytes 4-bit base (%s) is not "
                         "built yet (merge them into the unquantized base with fsdpctl merge)",
                    job->model.path);
    *q = *bnb ? (mq.double_quant ? MODEL_IMAGE_NF4_DQ : MODEL_IMAGE_NF4)
         : job->train.type == JOB_TRAIN_QLORA ? MODEL_IMAGE_NF4_DQ : MODEL_IMAGE_PLAIN;
    return 0;
}

static int fill(void *image, const job_config *job, const llama_layout *lo, model_image_dtype dt,
                model_image_quant q, int bnb, errbuf *err) {
    progress_state p = {.start = clock_now_s()};
    uint64_t seed = (uint64_t)job->train.seed;
    if (job->model.init == JOB_INIT_RANDOM)
        return q == MODEL_IMAGE_PLAIN
                   ? model_image_fill_random(image, lo, dt, seed, print_progress, &p, err)
                   : model_image_fill_nf4(image, lo, dt, q, NULL, 0, seed, print_progress, &p, err);
    st_model st;
    if (st_model_open(&st, job->model.path, err)) return -1;
    int rc = q == MODEL_IMAGE_PLAIN
                 ? model_image_fill_hf(image, lo, dt, &st, print_progress, &p, err)
                 : model_image_fill_nf4(image, lo, dt, q, &st, bnb, seed, print_progress, &p, err);
    st_model_close(&st);
    return rc;
}

int model_shm_create(const job_config *job, const llama_layout *lo, model_image_quant q, int bnb,
                     const char *name, int *fd, size_t *bytes, errbuf *err) {
    model_image_dtype dt = job->model.dtype == JOB_DTYPE_BF16 ? MODEL_IMAGE_BF16 : MODEL_IMAGE_F32;
    size_t n = model_image_bytes_q(lo, dt, q);
    int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0) return errf(err, "memfd_create: %s", strerror(errno));
    if (ftruncate(f, (off_t)n) != 0) {
        int e = errno;
        close(f);
        return errf(err, "model memory of %zu bytes: %s", n, strerror(e));
    }
    void *image = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (image == MAP_FAILED) {
        int e = errno;
        close(f);
        return errf(err, "mapping %zu bytes of model memory: %s", n, strerror(e));
    }
    int rc = fill(image, job, lo, dt, q, bnb, err);
    /* The writable mapping must be gone before the write seal can be set. */
    if (munmap(image, n) != 0 && rc == 0) rc = errf(err, "munmap: %s", strerror(errno));
    if (rc == 0 && fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
        rc = errf(err, "sealing the model memory: %s", strerror(errno));
    if (rc != 0) {
        close(f);
        return -1;
    }
    *fd = f;
    *bytes = n;
    return 0;
}
