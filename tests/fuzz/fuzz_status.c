/* Fuzzes proto/status: the input, as a status socket would receive it, is cut into lines and
 * each is parsed as a request (and as a reply, whose fields are checked for every command, and
 * as a socket file name, and as the output record of proto/status.h).  A request that
 * parses must name a command, and the parser never reads past the line it is given. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/status.h"

static void one_line(const uint8_t *data, size_t len) {
    /* An exact-size copy, so reading past the line is caught. */
    char *line = malloc(len ? len : 1);
    if (!line) return;
    memcpy(line, data, len);
    status_cmd cmd = (status_cmd)-1;
    errbuf err;
    if (status_request_parse(line, len, &cmd, &err) == 0 && strcmp(status_cmd_name(cmd), "unknown") == 0)
        abort();
    json_t *reply = NULL;
    if (status_reply_parse(line, len, &reply, &err) == 0) {
        if (!json_is_true(json_object_get(reply, "ok"))) abort();
        for (int c = STATUS_CMD_STATUS; c <= STATUS_CMD_STOP; c++) (void)status_reply_check((status_cmd)c, reply, &err);
        json_decref(reply);
    }
    char dir[256];
    if (status_output_record_parse(line, len, dir, sizeof dir, "record", &err) == 0 &&
        (dir[0] != '/' || strchr(dir, '\n') || strlen(dir) + 1 != len))
        abort();
    if (len < 256) {
        char name[256], id[STATUS_JOB_ID_MAX], path[STATUS_SOCKET_MAX], again[STATUS_SOCKET_MAX];
        int restart, node;
        memcpy(name, data, len);
        name[len && data[len - 1] == '\n' ? len - 1 : len] = '\0';
        /* A name that parses is one the daemon could have made, and makes it again. */
        if (status_socket_name_parse(name, id, &restart, &node) == 1) {
            if (status_socket_path(path, sizeof path, ".", id, restart, node, &err) == 0) {
                snprintf(again, sizeof again, "./%s", name);
                if (strcmp(path, again) != 0) abort();
            }
        }
    }
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    while (size > 0) {
        const uint8_t *nl = memchr(data, '\n', size);
        size_t len = nl ? (size_t)(nl - data) + 1 : size;
        one_line(data, len);
        data += len;
        size -= len;
    }
    one_line(data, 0);
    return 0;
}
