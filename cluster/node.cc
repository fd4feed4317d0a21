#include "cluster/node.h"

#include "cluster/topology.h"
#include "common/logging.h"
#include "wire/zmq_transport.h"

namespace gradsync::cluster {

StatusOr<Node> StartNode(const Config& config, wire::Role role, Deadline deadline) {
  GS_ASSIGN_OR_RETURN(NodeOptions options, NodeOptions::FromConfig(config));
  GS_ASSIGN_OR_RETURN(int64_t data_port, config.GetInt("data_port", 0));
  options.role = role;
  Node node;
  GS_ASSIGN_OR_RETURN(node.data, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(std::string bound,
                      node.data->Listen("tcp://*:" + std::to_string(data_port)));
  options.data_port = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  options.identity = node.data->identity();
  GS_ASSIGN_OR_RETURN(auto agent_transport, wire::ZmqTransport::Create({}));
  GS_ASSIGN_OR_RETURN(node.agent, NodeAgent::Join(options, std::move(agent_transport), deadline));
  const Assignment& a = node.agent->assignment();
  SetLogTag(a.self.Name());
  GS_LOG(INFO) << "joined job " << a.job_id << " as " << a.self.Name() << " (data port "
               << options.data_port << ", " << a.num_workers << " workers, " << a.num_servers
               << " servers)";
  GS_RETURN_IF_ERROR(
      node.agent->CheckReachability(PeersToReach(a.self, a.peers), deadline));
  return node;
}

}  // namespace gradsync::cluster
