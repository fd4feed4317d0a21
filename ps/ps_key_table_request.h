// KeyTable::Request: one decoded Push or Pull, as the key table's files
// (ps_key_table.cc, ps_key_table_rounds.cc) see it. Internal to the table.
#ifndef GRADSYNC_PS_PS_KEY_TABLE_REQUEST_H_
#define GRADSYNC_PS_PS_KEY_TABLE_REQUEST_H_

#include <string>

#include "ps/ps_key_table.h"

namespace gradsync::server {

struct KeyTable::Request {
  wire::Route from;
  wire::MsgType type;
  int32_t worker;
  Key key;
  uint64_t num_elements, round, version, step, seq;  // version: the push's or pull's base
  uint32_t epoch;
  wire::DType dtype;
  std::string codec;  // "": uncompressed

  std::string Name() const {
    return std::string(wire::MsgTypeName(type)) + " of bucket " + std::to_string(key.first) +
           " partition " + std::to_string(key.second) + " round " + std::to_string(round) +
           " from worker " + std::to_string(worker);
  }
};

}  // namespace gradsync::server

#endif  // GRADSYNC_PS_PS_KEY_TABLE_REQUEST_H_
