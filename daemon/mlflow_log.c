/* mlflow_log: the leader's MLflow run, its metrics sent from a background thread; see
 * mlflow_log.h. */
#include "daemon/mlflow_log.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "base/clock.h"
#include "daemon/log.h"
#include "daemon/step_scalars.h"
#include "proto/mlflow.h"

#define QUEUE_VALUES 4096     /* metric values waiting: about 580 steps of 7 */
#define CONNECT_TIMEOUT_S 3
#define REQUEST_TIMEOUT_S 10
#define ATTEMPTS 4            /* a batch's tries, 0.5, 1 and 2 s apart */
#define FINISH_S 10           /* mlflow_log_finish's time to send what is queued */
#define UPDATE_S 3            /* and then to mark the run */

typedef struct queued {
    const char *key; /* a step_scalars name (static) */
    double value;
    int64_t timestamp_ms, step;
} queued;

struct mlflow_log {
    char api[JOB_URI_MAX + 32]; /* runtime.mlflow_uri/api/2.0/mlflow/ */
    char run_id[MLFLOW_ID_MAX];
    CURL *curl;                 /* the caller's at the start, then the thread's alone */
    struct curl_slist *headers;
    char curl_error[CURL_ERROR_SIZE];
    char *answer;               /* the last answer's body, NUL-terminated */
    size_t answer_len;
    long http_status;
    pthread_t thread;
    pthread_mutex_t mu;         /* guards what follows */
    pthread_cond_t wake;
    queued q[QUEUE_VALUES];     /* a ring */
    size_t head, count;
    int stopping;
    /* Once stopping: when queued values are dropped unsent and a request in flight is cut
     * (curl's progress callback reads it without the lock); 0 before. */
    _Atomic double deadline;
    long long sent, dropped;
    int drop_logged;
    char last_error[sizeof(errbuf)];
};

static int64_t now_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* ---- one HTTP request ---- */

static size_t on_answer(char *data, size_t size, size_t n, void *arg) {
    mlflow_log *m = arg;
    size_t bytes = size * n;
    if (m->answer_len + bytes > MLFLOW_BODY_MAX) return 0; /* curl stops: CURLE_WRITE_ERROR */
    char *p = realloc(m->answer, m->answer_len + bytes + 1);
    if (!p) return 0;
    memcpy(p + m->answer_len, data, bytes);
    m->answer = p;
    m->answer_len += bytes;
    p[m->answer_len] = '\0';
    return bytes;
}

/* The last answer's body ("" when it had none). */
static const char *answer(const mlflow_log *m) { return m->answer ? m->answer : ""; }

/* POST body (or GET with query when body is NULL) to API/endpoint.  0 for an HTTP 2xx answer
 * (in m->answer); else -1 with the reason, *retry set when trying again may help (no
 * connection, a timeout, HTTP 429 or 5xx). */
static int request(mlflow_log *m, const char *endpoint, const char *query, const char *body, int *retry,
                   errbuf *err) {
    char url[sizeof m->api + 1024];
    int n = snprintf(url, sizeof url, "%s%s%s%s", m->api, endpoint, query ? "?" : "", query ? query : "");
    *retry = 0;
    if (n < 0 || (size_t)n >= sizeof url) return errf(err, "%s: the URL is too long", endpoint);
    m->answer_len = 0;
    if (m->answer) m->answer[0] = '\0';
    m->http_status = 0;
    m->curl_error[0] = '\0';
    CURL *c = m->curl;
    int bad = curl_easy_setopt(c, CURLOPT_URL, url) != CURLE_OK;
    if (body) bad |= curl_easy_setopt(c, CURLOPT_POSTFIELDS, body) != CURLE_OK;
    else bad |= curl_easy_setopt(c, CURLOPT_HTTPGET, 1L) != CURLE_OK;
    if (bad) return errf(err, "%s: libcurl refused the request's options", endpoint);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_ABORTED_BY_CALLBACK) return errf(err, "%s: no answer before the deadline at the job's end", endpoint);
    if (rc != CURLE_OK) {
        *retry = 1;
        return errf(err, "%s: %s", endpoint, m->curl_error[0] ? m->curl_error : curl_easy_strerror(rc));
    }
    if (curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &m->http_status) != CURLE_OK)
        return errf(err, "%s: libcurl has no HTTP status for the answer", endpoint);
    if (m->http_status >= 200 && m->http_status < 300) return 0;
    *retry = m->http_status == 429 || m->http_status >= 500;
    char why[300];
    mlflow_error_text(answer(m), m->answer_len, why, sizeof why);
    return errf(err, "%s: HTTP %ld %s", endpoint, m->http_status, why);
}

/* A request still in flight at the deadline is cut: a server that accepts and never answers
 * holds fsdpd's end back FINISH_S + UPDATE_S seconds at most. */
static int past_deadline(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    mlflow_log *m = arg;
    double d = atomic_load(&m->deadline);
    return d > 0 && clock_now_s() > d;
}

/* The connection's socket is not the workers' (fsdpd forks them while the sender runs). */
static int close_on_exec(void *arg, curl_socket_t fd, curlsocktype purpose) {
    (void)arg, (void)purpose;
    return fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 ? CURL_SOCKOPT_OK : CURL_SOCKOPT_ERROR;
}

static int setup_curl(mlflow_log *m, errbuf *err) {
    m->curl = curl_easy_init();
    if (!m->curl) return errf(err, "libcurl: cannot create a handle");
    m->headers = curl_slist_append(NULL, "Content-Type: application/json");
    const char *token = getenv("MLFLOW_TRACKING_TOKEN");
    if (m->headers && token && *token) {
        size_t n = strlen(token) + 32;
        char *h = malloc(n);
        struct curl_slist *more = NULL;
        if (h) {
            snprintf(h, n, "Authorization: Bearer %s", token);
            more = curl_slist_append(m->headers, h);
            memset(h, 0, n); /* the token lives in curl's list only */
            free(h);
        }
        if (!more) return errf(err, "out of memory for the request headers");
        m->headers = more;
    }
    if (!m->headers) return errf(err, "out of memory for the request headers");
    CURL *c = m->curl;
    int bad = curl_easy_setopt(c, CURLOPT_HTTPHEADER, m->headers) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_answer) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, m) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, m->curl_error) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)REQUEST_TIMEOUT_S) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK; /* timeouts without SIGALRM: a thread */
    bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_SOCKOPTFUNCTION, close_on_exec) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, past_deadline) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_XFERINFODATA, m) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
    return bad ? errf(err, "libcurl refused the connection options") : 0;
}

/* ---- the start: experiment, run, parameters ---- */

static int find_experiment(mlflow_log *m, const char *name, char id[MLFLOW_ID_MAX], errbuf *err) {
    char query[1024] = "experiment_name=";
    int retry;
    if (mlflow_query_escape(name, query + strlen(query), sizeof query - strlen(query), err)) return -1;
    if (request(m, "experiments/get-by-name", query, NULL, &retry, err) == 0)
        return mlflow_parse_experiment(answer(m), m->answer_len, id, err);
    if (m->http_status != 404) return -1;
    char *body = mlflow_experiment_create_body(name, err);
    int rc = body ? request(m, "experiments/create", NULL, body, &retry, err) : -1;
    free(body);
    if (rc == 0) rc = mlflow_parse_experiment_created(answer(m), m->answer_len, id, err);
    if (rc == 0) log_event(-1, "mlflow: created experiment '%s' (%s)", name, id);
    return rc;
}

/* output.dir's last component, and the SLURM job id under SLURM. */
static void run_name(const job_config *j, char *out, size_t n) {
    char dir[JOB_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", j->output.dir);
    const char *job_id = getenv("SLURM_JOB_ID");
    snprintf(out, n, "%s%s%s", basename(dir), job_id ? "-" : "", job_id ? job_id : "");
}

static int log_params(mlflow_log *m, const job_config *j, errbuf *err) {
    json_t *job = job_to_object(j, err);
    if (!job) return -1;
    int rc = 0, retry;
    size_t first, next = 0;
    do { /* MLFLOW_MAX_PARAMS a request, until one would be empty */
        first = next;
        char *body = mlflow_params_body(m->run_id, job, first, &next, err);
        rc = body ? (next > first ? request(m, "runs/log-batch", NULL, body, &retry, err) : 0) : -1;
        free(body);
    } while (rc == 0 && next > first);
    json_decref(job);
    return rc;
}

static int open_run(mlflow_log *m, const job_config *j, errbuf *err) {
    char experiment[MLFLOW_ID_MAX], name[256];
    if (find_experiment(m, j->runtime.mlflow_experiment, experiment, err)) return -1;
    run_name(j, name, sizeof name);
    char *body = mlflow_run_create_body(experiment, name, now_ms(), err);
    int retry, rc = body ? request(m, "runs/create", NULL, body, &retry, err) : -1;
    free(body);
    if (rc == 0) rc = mlflow_parse_run(answer(m), m->answer_len, m->run_id, err);
    if (rc == 0) rc = log_params(m, j, err);
    if (rc == 0)
        log_event(-1, "mlflow: run %s ('%s') in experiment '%s' (%s) at %s", m->run_id, name,
                  j->runtime.mlflow_experiment, experiment, j->runtime.mlflow_uri);
    return rc;
}

/* ---- the thread ---- */

/* Called with mu held. */
static void note_drop(mlflow_log *m, size_t n, const char *why) {
    m->dropped += (long long)n;
    snprintf(m->last_error, sizeof m->last_error, "%s", why);
    if (m->drop_logged) return;
    m->drop_logged = 1;
    log_event(-1, "mlflow: metrics dropped (%s); training goes on, the count is logged at the end", why);
}

/* Sends one batch, retrying while the server may come back; with mu held (released while a
 * request is in flight or a backoff waits). */
static void send_batch(mlflow_log *m, const queued *b, size_t n) {
    mlflow_metric metrics[MLFLOW_MAX_METRICS];
    for (size_t i = 0; i < n; i++) metrics[i] = (mlflow_metric){b[i].key, b[i].value, b[i].timestamp_ms, b[i].step};
    errbuf err;
    snprintf(err.msg, sizeof err.msg, "not sent within %d s of the job's end", FINISH_S);
    char *body = mlflow_metrics_body(m->run_id, metrics, n, &err);
    int ok = 0;
    for (int attempt = 0; body && attempt < ATTEMPTS; attempt++) {
        if (m->stopping && (attempt > 0 || clock_now_s() > atomic_load(&m->deadline))) break; /* no retries at the end */
        int retry;
        pthread_mutex_unlock(&m->mu);
        ok = request(m, "runs/log-batch", NULL, body, &retry, &err) == 0;
        pthread_mutex_lock(&m->mu);
        if (ok || !retry || attempt + 1 == ATTEMPTS) break; /* no wait after the last try */
        double wait = 0.5 * (1 << attempt);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += (time_t)wait;
        until.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (!m->stopping && pthread_cond_timedwait(&m->wake, &m->mu, &until) == 0) {
        }
    }
    free(body);
    if (ok) m->sent += (long long)n;
    else note_drop(m, n, err.msg);
}

static void *sender(void *arg) {
    mlflow_log *m = arg;
    static queued batch[MLFLOW_MAX_METRICS]; /* one sender thread a process */
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->count && !m->stopping) pthread_cond_wait(&m->wake, &m->mu);
        if (!m->count) break;
        size_t n = m->count < MLFLOW_MAX_METRICS ? m->count : MLFLOW_MAX_METRICS;
        for (size_t i = 0; i < n; i++) batch[i] = m->q[(m->head + i) % QUEUE_VALUES];
        m->head = (m->head + n) % QUEUE_VALUES;
        m->count -= n;
        send_batch(m, batch, n);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* ---- the interface ---- */

static void free_log(mlflow_log *m) {
    if (m->headers) curl_slist_free_all(m->headers);
    if (m->curl) curl_easy_cleanup(m->curl);
    free(m->answer);
    free(m);
    curl_global_cleanup();
}

int mlflow_log_start(mlflow_log **out, const job_config *j, errbuf *err) {
    *out = NULL;
    if (!(j->runtime.log_to & JOB_LOG_MLFLOW)) return 0;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return errf(err, "libcurl: cannot initialise");
    mlflow_log *m = calloc(1, sizeof *m);
    if (!m) {
        curl_global_cleanup();
        return errf(err, "out of memory");
    }
    const char *uri = j->runtime.mlflow_uri;
    size_t n = strlen(uri);
    while (n > 0 && uri[n - 1] == '/') n--;
    snprintf(m->api, sizeof m->api, "%.*s/api/2.0/mlflow/", (int)n, uri);
    int rc = setup_curl(m, err);
    if (rc == 0) rc = open_run(m, j, err);
    if (rc == 0 && (pthread_mutex_init(&m->mu, NULL) || pthread_cond_init(&m->wake, NULL)))
        rc = errf(err, "cannot set up the sender's lock");
    if (rc == 0) { /* the sender takes no signal: fsdpd's loop handles them */
        sigset_t all, old;
        sigfillset(&all);
        int e = pthread_sigmask(SIG_SETMASK, &all, &old);
        if (e == 0) {
            e = pthread_create(&m->thread, NULL, sender, m);
            (void)pthread_sigmask(SIG_SETMASK, &old, NULL); /* the mask it gave back: cannot fail (EINVAL is for `how`) */
        }
        if (e) rc = errf(err, "cannot start the sender thread: %s", strerror(e));
    }
    if (rc == 0) {
        *out = m;
        return 0;
    }
    free_log(m);
    if (j->runtime.log_required) return errprefix(err, "runtime.log_required: MLflow at %s", uri);
    log_event(-1, "warning: runtime.log_to mlflow: cannot log to %s: %s; training without MLflow "
                  "(runtime.log_required=true makes this an error)", uri, err->msg);
    return 0;
}

void mlflow_log_step(mlflow_log *m, const msg_metrics *x) {
    if (!m) return;
    step_scalar s[STEP_SCALARS_MAX];
    size_t n = step_scalars(x, s);
    int64_t t = now_ms();
    pthread_mutex_lock(&m->mu);
    if (m->count + n > QUEUE_VALUES) {
        note_drop(m, n, "the queue is full: the tracking server is slow or down");
    } else {
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(s[i].value)) continue; /* JSON has no NaN; metrics.jsonl has the step */
            m->q[(m->head + m->count++) % QUEUE_VALUES] = (queued){s[i].name, s[i].value, t, x->step};
        }
        pthread_cond_signal(&m->wake);
    }
    pthread_mutex_unlock(&m->mu);
}

void mlflow_log_finish(mlflow_log *m, const char *status) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    atomic_store(&m->deadline, clock_now_s() + FINISH_S);
    pthread_cond_broadcast(&m->wake);
    pthread_mutex_unlock(&m->mu);
    int e = pthread_join(m->thread, NULL);
    if (e) log_event(-1, "mlflow: cannot join the sender thread: %s", strerror(e));
    atomic_store(&m->deadline, clock_now_s() + UPDATE_S);
    errbuf err;
    int retry;
    char *body = mlflow_run_update_body(m->run_id, status, now_ms(), &err);
    if (!body || request(m, "runs/update", NULL, body, &retry, &err))
        log_event(-1, "mlflow: run %s not marked %s: %s", m->run_id, status, err.msg);
    free(body);
    if (m->dropped)
        log_event(-1, "mlflow: run %s ended %s: %lld metric values sent, %lld dropped (last: %s)", m->run_id, status,
                  m->sent, m->dropped, m->last_error);
    else
        log_event(-1, "mlflow: run %s ended %s: %lld metric values sent, none dropped", m->run_id, status, m->sent);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->mu);
    free_log(m);
}
