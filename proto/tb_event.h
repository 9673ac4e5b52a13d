/* tb_event: TensorBoard's event files (what tf.summary and torch's SummaryWriter write),
 * encoded here, without a protobuf library: the TFRecord framing and the few protocol-buffer
 * fields that scalars, a text summary and a restart need.
 *
 * A file (named events.out.tfevents.*) is a sequence of records:
 *   uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes,
 *   length bytes of data (one serialized Event), uint32 masked CRC32C of the data,
 * masked as TFRecord masks: ((crc >> 15) | (crc << 17)) + 0xa282ead8.  The first Event holds
 * file_version "brain.Event:2".  The fields written (tensorflow/core/util/event.proto,
 * framework/summary.proto, tensor.proto, tensor_shape.proto; field number and wire type):
 *   Event:           wall_time 1 (double), step 2 (int64), file_version 3 (string),
 *                    summary 5 (Summary), session_log 7 (SessionLog)
 *   Summary:         value 1 (repeated Summary.Value)
 *   Summary.Value:   tag 1 (string), simple_value 2 (float), tensor 8 (TensorProto),
 *                    metadata 9 (SummaryMetadata)
 *   SummaryMetadata: plugin_data 1 (PluginData: plugin_name 1 (string), content 2 (bytes))
 *   TensorProto:     dtype 1 (enum, DT_STRING = 7), tensor_shape 2 (empty: a scalar),
 *                    string_val 8 (repeated bytes)
 *   SessionLog:      status 1 (enum, START = 1)
 * A text summary is what TensorBoard's text plugin reads: a scalar string tensor under plugin
 * "text" (empty content: TextPluginData's version 0).  A SessionLog START at step N tells
 * TensorBoard that a run began again there: it drops what it read at steps >= N (the steps a
 * restart repeats). */
#ifndef FSDP_TB_EVENT_H
#define FSDP_TB_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"

/* Bytes appended to by the encoders (data malloc'd; zero-initialise, free with tb_buf_free). */
typedef struct tb_buf {
    uint8_t *data;
    size_t len, cap;
} tb_buf;
void tb_buf_free(tb_buf *b);

uint32_t tb_masked_crc32c(const void *data, size_t len);

typedef struct tb_scalar {
    const char *tag;
    float value;
} tb_scalar;

/* Each appends one framed record to out (-1 only out of memory, with the message). */
int tb_record_file_version(tb_buf *out, double wall_time, errbuf *err);
int tb_record_session_start(tb_buf *out, double wall_time, int64_t step, errbuf *err);
int tb_record_scalars(tb_buf *out, double wall_time, int64_t step, const tb_scalar *s, size_t n, errbuf *err);
int tb_record_text(tb_buf *out, double wall_time, int64_t step, const char *tag, const char *text, size_t len,
                   errbuf *err);

#endif
