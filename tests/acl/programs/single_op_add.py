"""Single-operator Add, written as Ascend's single-operator sample writes it: the op model was compiled by
``atc --singleop`` into a directory, the program loads the directory, describes two float16 inputs and one
output, executes ``Add`` on a stream and checks the sum on the host.

    python single_op_add.py op_models/
"""
import sys

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_FLOAT16 = 1
ACL_FORMAT_ND = 2
ACL_ERROR_OP_NOT_FOUND = 100024


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{message} failed ret={ret}: {acl.get_recent_err_msg()}")


class SingleOp:
    def __init__(self, device_id, model_path, op_type):
        self.device_id = device_id
        self.model_path = model_path
        self.op_type = op_type
        self.context = None
        self.stream = None
        self.input_desc = []
        self.output_desc = []
        self.device_inputs = []
        self.device_outputs = []
        self.device_buffer_inputs = []
        self.device_buffer_outputs = []
        self.op_attr = None
        self.shape = [8, 16]

    def init_resource(self):
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check_ret("acl.rt.create_stream", ret)
        check_ret("acl.op.set_model_dir", acl.op.set_model_dir(self.model_path))
        self.op_attr = acl.op.create_attr()

    def _gen_input_tensor(self, factor_a, factor_b):
        for factor in (factor_a, factor_b):
            self.input_desc.append(acl.create_tensor_desc(ACL_FLOAT16, self.shape, ACL_FORMAT_ND))
            size = acl.get_tensor_desc_size(self.input_desc[-1])
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
            check_ret("acl.rt.malloc", ret)
            data = factor.tobytes()
            check_ret("acl.rt.memcpy", acl.rt.memcpy(ptr, size, acl.util.bytes_to_ptr(data), len(data),
                                                     ACL_MEMCPY_HOST_TO_DEVICE))
            self.device_inputs.append(ptr)
            self.device_buffer_inputs.append(acl.create_data_buffer(ptr, size))

    def _gen_output_tensor(self):
        self.output_desc.append(acl.create_tensor_desc(ACL_FLOAT16, self.shape, ACL_FORMAT_ND))
        size = acl.get_tensor_desc_size(self.output_desc[0])
        ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
        check_ret("acl.rt.malloc", ret)
        self.device_outputs.append(ptr)
        self.device_buffer_outputs.append(acl.create_data_buffer(ptr, size))

    def run(self, factor_a, factor_b):
        self._gen_input_tensor(factor_a, factor_b)
        self._gen_output_tensor()
        ret = acl.op.execute_v2(self.op_type, self.input_desc, self.device_buffer_inputs, self.output_desc,
                                self.device_buffer_outputs, self.op_attr, self.stream)
        check_ret("acl.op.execute_v2", ret)
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        size = acl.get_tensor_desc_size(self.output_desc[0])
        result = bytes(size)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(acl.util.bytes_to_ptr(result), size, self.device_outputs[0], size,
                                                 ACL_MEMCPY_DEVICE_TO_HOST))
        return np.frombuffer(result, np.float16).reshape(self.shape)

    def release_resource(self):
        for desc in self.input_desc + self.output_desc:
            acl.destroy_tensor_desc(desc)
        for buf in self.device_buffer_inputs + self.device_buffer_outputs:
            check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(buf))
        for ptr in self.device_inputs + self.device_outputs:
            check_ret("acl.rt.free", acl.rt.free(ptr))
        acl.op.destroy_attr(self.op_attr)
        check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(self.stream))
        check_ret("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check_ret("acl.rt.reset_device", acl.rt.reset_device(self.device_id))
        check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    op = SingleOp(0, sys.argv[1], "Add")
    op.init_resource()
    rng = np.random.default_rng(0)
    a = rng.uniform(-4, 4, op.shape).astype(np.float16)
    b = rng.uniform(-4, 4, op.shape).astype(np.float16)
    out = op.run(a, b)
    np.testing.assert_allclose(out.astype(np.float32), (a.astype(np.float32) + b.astype(np.float32)),
                               rtol=1e-3, atol=1e-3)
    print("[INFO] result matches numpy:", out[0, :4].tolist())
    # a shape no op model was compiled for: CANN's code, the program carries on
    desc = acl.create_tensor_desc(ACL_FLOAT16, [4, 4], ACL_FORMAT_ND)
    ret = acl.op.execute_v2("Add", [desc, desc], op.device_buffer_inputs, [desc], op.device_buffer_outputs,
                            op.op_attr, op.stream)
    assert ret == ACL_ERROR_OP_NOT_FOUND, ret
    print("[INFO] unmatched shape:", ret)
    acl.destroy_tensor_desc(desc)
    op.release_resource()
    print("OK")
