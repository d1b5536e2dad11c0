"""Asynchronous classification, as CANN's ResNet-50 async sample does it: copies and executions queued on a
stream, a callback per image run on the program's own report thread (util.start_thread, subscribe_report,
process_report), each callback reading the output back into bytes and checking it against numpy.

    python infer_async.py resnet50.om resnet50.npz
"""
import sys

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_CALLBACK_BLOCK = 1
NPY_FLOAT32 = 11
IMAGES = 6


def check(ret, what):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def reference(x, w):
    z = x.astype(np.float64).mean(axis=(2, 3)) @ w["w"] + w["b"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Sample:
    def __init__(self, model_path):
        self.device_id = 0
        check(acl.init(), "acl.init")
        check(acl.rt.set_device(self.device_id), "set_device")
        self.context, ret = acl.rt.create_context(self.device_id)
        check(ret, "create_context")
        self.stream, ret = acl.rt.create_stream()
        check(ret, "create_stream")
        self.model_id, ret = acl.mdl.load_from_file(model_path)
        check(ret, "load_from_file")
        self.desc = acl.mdl.create_desc()
        check(acl.mdl.get_desc(self.desc, self.model_id), "get_desc")
        self.exit_flag = False
        self.results = {}
        self.callbacks_on = set()

    def report_thread(self, args_list):
        context = args_list[0]
        check(acl.rt.set_context(context), "set_context in the report thread")
        while True:
            acl.rt.process_report(100)          # 100 ms; returns a timeout code when nothing is due
            if self.exit_flag:
                break

    def make_dataset(self, sizes):
        dataset = acl.mdl.create_dataset()
        ptrs = []
        for size in sizes:
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
            check(ret, "malloc")
            buf = acl.create_data_buffer(ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(dataset, buf)
            check(ret, "add_dataset_buffer")
            ptrs.append(ptr)
        return dataset, ptrs

    def callback(self, user_data):
        import threading
        index, out_ptr, out_size = user_data
        self.callbacks_on.add(threading.get_native_id())
        host = bytes(out_size)
        check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), out_size, out_ptr, out_size, ACL_MEMCPY_DEVICE_TO_HOST),
              "memcpy in callback")
        self.results[index] = np.frombuffer(host, dtype=np.float32).copy()

    def run(self, weights):
        n_in, n_out = acl.mdl.get_num_inputs(self.desc), acl.mdl.get_num_outputs(self.desc)
        assert (n_in, n_out) == (1, 1), (n_in, n_out)
        dims, ret = acl.mdl.get_input_dims(self.desc, 0)
        check(ret, "get_input_dims")
        shape = tuple(dims["dims"])
        in_size = acl.mdl.get_input_size_by_index(self.desc, 0)
        out_size = acl.mdl.get_output_size_by_index(self.desc, 0)
        tid, ret = acl.util.start_thread(self.report_thread, [self.context])
        check(ret, "start_thread")
        check(acl.rt.subscribe_report(tid, self.stream), "subscribe_report")

        rng = np.random.default_rng(1)
        images = [rng.random(shape, dtype=np.float32) for _ in range(IMAGES)]
        host_in = []
        datasets = []
        for i, image in enumerate(images):
            inputs, (in_ptr,) = self.make_dataset([in_size])
            outputs, (out_ptr,) = self.make_dataset([out_size])
            datasets.append((inputs, outputs, in_ptr, out_ptr))
            data = image.tobytes()
            host_in.append(data)                 # the bytes must outlive their pointer (pyACL's rule)
            check(acl.rt.memcpy_async(in_ptr, in_size, acl.util.bytes_to_ptr(data), in_size,
                                      ACL_MEMCPY_HOST_TO_DEVICE, self.stream), "memcpy_async")
            check(acl.mdl.execute_async(self.model_id, inputs, outputs, self.stream), "execute_async")
            check(acl.rt.launch_callback(self.callback, (i, out_ptr, out_size), ACL_CALLBACK_BLOCK, self.stream),
                  "launch_callback")
        check(acl.rt.synchronize_stream(self.stream), "synchronize_stream")
        check(acl.rt.unsubscribe_report(tid, self.stream), "unsubscribe_report")
        self.exit_flag = True
        check(acl.util.stop_thread(tid), "stop_thread")

        assert sorted(self.results) == list(range(IMAGES)), sorted(self.results)
        assert self.callbacks_on == {tid}, (self.callbacks_on, tid)      # callbacks ran on the report thread
        for i, image in enumerate(images):
            np.testing.assert_allclose(self.results[i].reshape(1, -1), reference(image, weights), rtol=1e-4, atol=1e-6)
        for inputs, outputs, in_ptr, out_ptr in datasets:
            for ds in (inputs, outputs):
                for k in range(acl.mdl.get_dataset_num_buffers(ds)):
                    check(acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(ds, k)), "destroy_data_buffer")
                check(acl.mdl.destroy_dataset(ds), "destroy_dataset")
            check(acl.rt.free(in_ptr), "free")
            check(acl.rt.free(out_ptr), "free")
        print(f"{IMAGES} images classified asynchronously, callbacks on thread {tid}; top-1",
              [int(self.results[i].argmax()) for i in range(IMAGES)])

    def release(self):
        check(acl.mdl.destroy_desc(self.desc), "destroy_desc")
        check(acl.mdl.unload(self.model_id), "unload")
        check(acl.rt.destroy_stream(self.stream), "destroy_stream")
        check(acl.rt.destroy_context(self.context), "destroy_context")
        check(acl.rt.reset_device(self.device_id), "reset_device")
        check(acl.finalize(), "finalize")


if __name__ == "__main__":
    sample = Sample(sys.argv[1])
    sample.run(np.load(sys.argv[2]))
    sample.release()
    print("OK")
