/* What build.rs hands to bindgen: the verbs API of rdma-core. */
#include <infiniband/verbs.h>
