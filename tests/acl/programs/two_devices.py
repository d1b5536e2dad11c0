"""Two cards from one process, as multi-device inference libraries drive them: a context per card,
``set_context`` before each batch of calls, a model loaded on each card, work interleaved between the two,
then the same from one Python thread per card.

    python two_devices.py resnet50.om resnet50.npz
"""
import sys
import threading

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2


def check(ret, what):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def reference(x, w):
    z = x.astype(np.float64).mean(axis=(2, 3)) @ w["w"] + w["b"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Card:
    def __init__(self, device_id, model_path):
        self.device_id = device_id
        check(acl.rt.set_device(device_id), "set_device")
        self.context, ret = acl.rt.create_context(device_id)
        check(ret, "create_context")
        self.stream, ret = acl.rt.create_stream()
        check(ret, "create_stream")
        self.model_id, ret = acl.mdl.load_from_file(model_path)
        check(ret, "load_from_file")
        self.desc = acl.mdl.create_desc()
        check(acl.mdl.get_desc(self.desc, self.model_id), "get_desc")
        self.in_size = acl.mdl.get_input_size_by_index(self.desc, 0)
        self.out_size = acl.mdl.get_output_size_by_index(self.desc, 0)
        dims, ret = acl.mdl.get_input_dims(self.desc, 0)
        self.shape = tuple(dims["dims"])
        self.in_ptr, ret = acl.rt.malloc(self.in_size, 0)
        check(ret, "malloc")
        self.out_ptr, ret = acl.rt.malloc(self.out_size, 0)
        check(ret, "malloc")
        self.inputs, self.outputs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
        acl.mdl.add_dataset_buffer(self.inputs, acl.create_data_buffer(self.in_ptr, self.in_size))
        acl.mdl.add_dataset_buffer(self.outputs, acl.create_data_buffer(self.out_ptr, self.out_size))

    def submit(self, image):
        check(acl.rt.set_context(self.context), "set_context")
        device, ret = acl.rt.get_device()
        assert (device, ret) == (self.device_id, 0), (device, ret)
        check(acl.rt.memcpy_async(self.in_ptr, self.in_size, acl.util.numpy_to_ptr(image), image.nbytes,
                                  ACL_MEMCPY_HOST_TO_DEVICE, self.stream), "memcpy_async")
        check(acl.mdl.execute_async(self.model_id, self.inputs, self.outputs, self.stream), "execute_async")

    def collect(self):
        check(acl.rt.set_context(self.context), "set_context")
        check(acl.rt.synchronize_stream(self.stream), "synchronize_stream")
        out = np.empty((1, 1000), np.float32)
        check(acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, self.out_ptr, out.nbytes,
                            ACL_MEMCPY_DEVICE_TO_HOST), "memcpy")
        return out

    def release(self):
        check(acl.rt.set_context(self.context), "set_context")
        for ds in (self.inputs, self.outputs):
            check(acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(ds, 0)), "destroy_data_buffer")
            check(acl.mdl.destroy_dataset(ds), "destroy_dataset")
        check(acl.rt.free(self.in_ptr), "free")
        check(acl.rt.free(self.out_ptr), "free")
        check(acl.mdl.destroy_desc(self.desc), "destroy_desc")
        check(acl.mdl.unload(self.model_id), "unload")
        check(acl.rt.destroy_stream(self.stream), "destroy_stream")
        check(acl.rt.destroy_context(self.context), "destroy_context")
        check(acl.rt.reset_device(self.device_id), "reset_device")


def main(model_path, weights_path):
    weights = np.load(weights_path)
    check(acl.init(), "acl.init")
    count, ret = acl.rt.get_device_count()
    assert ret == 0 and count >= 2, (count, ret)
    cards = [Card(0, model_path), Card(1, model_path)]
    rng = np.random.default_rng(3)

    for step in range(3):                           # interleaved from one thread
        images = [rng.random(card.shape, dtype=np.float32) for card in cards]
        for card, image in zip(cards, images):
            card.submit(image)
        for card, image in zip(cards, images):
            np.testing.assert_allclose(card.collect(), reference(image, weights), rtol=1e-4, atol=1e-6)

    # the model of card 1 cannot run on a stream of card 0
    check(acl.rt.set_context(cards[0].context), "set_context")
    ret = acl.mdl.execute_async(cards[1].model_id, cards[1].inputs, cards[1].outputs, cards[0].stream)
    assert ret != 0, ret

    errors = []

    def worker(card, image):                        # a new thread gets no context: it sets its own
        try:
            for _ in range(3):
                card.submit(image)
                np.testing.assert_allclose(card.collect(), reference(image, weights), rtol=1e-4, atol=1e-6)
        except Exception as e:                      # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(card, rng.random(card.shape, dtype=np.float32)))
               for card in cards]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for card in cards:
        card.release()
    check(acl.finalize(), "finalize")
    print("OK: two cards from one process")


if __name__ == "__main__":
    main(*sys.argv[1:3])
