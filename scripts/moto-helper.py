#!/usr/bin/env python3
"""moto's IAM and EC2 through boto3, for the aws-ec2 driver's tests.

Run with the python of target/moto-venv (scripts/moto installs boto3 there):

  moto-helper.py arm URL        create an IAM user allowed everything and its
                                access key, then turn on moto's auth; prints
                                {"key", "secret", "ami", "unsigned"} as JSON
                                ("unsigned": the status an unsigned request
                                now gets)
  moto-helper.py instances URL  every instance, {id: {"state", "tags"}}
  moto-helper.py launch URL AMI TYPE TAGS_JSON COUNT
                                COUNT instances, one launch each; {"ids"}

instances and launch sign with $MOTO_KEY and $MOTO_SECRET.
"""
import json, os, sys, urllib.error, urllib.request
import boto3

cmd, url = sys.argv[1], sys.argv[2]

def client(service, key="dummy", secret="dummy"):
    return boto3.client(service, endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)

def ec2():
    return client("ec2", os.environ["MOTO_KEY"], os.environ["MOTO_SECRET"])

if cmd == "arm":
    # Before arming, moto takes any keys.
    iam = client("iam")
    iam.create_user(UserName="berth")
    iam.put_user_policy(UserName="berth", PolicyName="everything", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="berth")["AccessKey"]
    images = client("ec2").describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["amzn2-ami-hvm-*-x86_64-gp2"]}])["Images"]
    ami = max((i["Name"], i["ImageId"]) for i in images)[1]
    # From here on every request must be signed by a known key.
    urllib.request.urlopen(urllib.request.Request(
        url + "/moto-api/reset-auth", data=b"0",
        headers={"Content-Type": "text/plain"}, method="POST"), timeout=60).read()
    unsigned = urllib.request.Request(
        url + "/", data=b"Action=DescribeInstances&Version=2016-11-15", method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    try:
        answer = "%d" % urllib.request.urlopen(unsigned, timeout=60).status
    except urllib.error.HTTPError as e:
        answer = "%d" % e.code
    print(json.dumps({"key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                      "ami": ami, "unsigned": answer}))
elif cmd == "instances":
    out = {}
    for page in ec2().get_paginator("describe_instances").paginate():
        for r in page["Reservations"]:
            for i in r["Instances"]:
                out[i["InstanceId"]] = {
                    "state": i["State"]["Name"],
                    "tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])}}
    print(json.dumps(out))
elif cmd == "launch":
    ami, itype, tags, count = sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), int(sys.argv[6])
    # One launch each: moto pages DescribeInstances by reservation.
    ids = [ec2().run_instances(ImageId=ami, InstanceType=itype, MinCount=1, MaxCount=1,
               TagSpecifications=[{"ResourceType": "instance", "Tags": tags}]
           )["Instances"][0]["InstanceId"] for _ in range(count)]
    print(json.dumps({"ids": ids}))
else:
    sys.exit("unknown command " + cmd)
